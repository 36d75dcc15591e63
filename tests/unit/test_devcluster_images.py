"""Images without Docker, the pure half: FROM mapping, .dockerignore, input digests, references."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.devcluster.bases import BUSYBOX, PYTHON, from_map
from gate.devcluster.build import load_components
from gate.devcluster.dockerfile import (
    Dockerfile,
    DockerfileError,
    base_overrides,
    context_inputs,
    ignore_rules,
    inputs_digest,
    is_ignored,
)
from gate.devcluster.images import (
    format_references,
    local_name,
    package_identity,
    parse_references,
    reference,
    targets,
)
from gate.devcluster.registry import registry_config

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def test_the_project_dockerfile_gets_the_local_python_base_through_its_build_argument() -> None:
    parsed = Dockerfile.parse((REPO / "Dockerfile").read_text())
    overrides = base_overrides(parsed, from_map())
    assert overrides.build_args == {"PYTHON_IMAGE": "localhost/nodegate-base/python:3.11-bookworm"}
    assert overrides.from_image is None
    assert overrides.buildah_args() == ["--build-arg", "PYTHON_IMAGE=localhost/nodegate-base/python:3.11-bookworm"]


def test_every_package_dockerfile_gets_the_local_busybox_base_through_from() -> None:
    dockerfiles = sorted((REPO / "packages").glob("*/Dockerfile"))
    assert len(dockerfiles) >= 4
    for path in dockerfiles:
        overrides = base_overrides(Dockerfile.parse(path.read_text()), from_map())
        assert overrides.from_image == BUSYBOX.image, path
        assert overrides.build_args == {}
        assert overrides.buildah_args() == ["--from", BUSYBOX.image]


def test_the_bases_map_exactly_the_public_images_the_dockerfiles_name() -> None:
    assert from_map() == {"python:3.11-slim-bookworm": PYTHON.image, "busybox:1.37": BUSYBOX.image}
    assert all(base.image.startswith("localhost/nodegate-base/") for base in (PYTHON, BUSYBOX))


@pytest.mark.parametrize(("text", "message"), [
    ("FROM alpine:3.20\n", "FROM alpine:3.20: no local base"),
    ("ARG BASE=debian:12\nFROM ${BASE}\n", "FROM debian:12: no local base"),
    ("ARG BASE\nFROM $BASE\n", "build argument BASE has no default"),
    ("FROM busybox:1.37\nFROM busybox:1.37\n", "a literal FROM after the first"),
    ("ARG V=1.37\nFROM busybox:${V}\n", "only a FROM that is one build argument"),
    ("COPY a b\n", "before the first FROM"),
    ("# nothing\n", "no FROM"),
])
def test_a_from_that_no_local_base_replaces_is_refused_with_its_name(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=message.replace("$", r"\$").replace("{", r"\{")):
        base_overrides(Dockerfile.parse(text), from_map())


def test_stages_scratch_and_later_froms_through_the_argument_need_no_override() -> None:
    text = ("ARG PY=python:3.11-slim-bookworm\nFROM ${PY} AS build\nRUN true\n"
            "FROM build AS test\nFROM scratch\nCOPY --from=build /x /x\nFROM ${PY}\n")
    overrides = base_overrides(Dockerfile.parse(text), from_map())
    assert overrides.build_args == {"PY": PYTHON.image} and overrides.from_image is None


def test_parsing_joins_continuations_skips_comments_and_reads_copy_forms() -> None:
    text = (
        "# syntax=docker/dockerfile:1.7\n"
        "ARG A=x\n"
        "FROM --platform=linux/amd64 busybox:1.37 AS one\n"
        "RUN a \\\n  # a comment inside\n  && b\n"
        "COPY --chown=0:0 a.txt \\\n     dir/ /dst/\n"
        'COPY ["with space.txt", "/dst/"]\n'
        "COPY --from=one /etc/x /etc/x\n"
    )
    parsed = Dockerfile.parse(text)
    assert parsed.args == {"A": "x"}
    (stage,) = parsed.stages
    assert (stage.base, stage.name) == ("busybox:1.37", "one")
    assert [(c.sources, c.destination, c.from_stage) for c in stage.copies] == [
        (("a.txt", "dir/"), "/dst/", None), (("with space.txt",), "/dst/", None), (("/etc/x",), "/etc/x", "one"),
    ]


@pytest.mark.parametrize(("path", "ignored"), [
    ("pyproject.toml", False),
    ("README.md", False),
    ("gate/__init__.py", False),
    ("gate/cli/main.py", False),
    ("gate/__pycache__/x.pyc", True),
    ("gate/cli/__pycache__/main.cpython-311.pyc", True),
    ("gate/stray.pyc", True),
    ("tests/unit/test_x.py", True),
    (".venv/bin/python", True),
    ("Dockerfile", True),
])
def test_dockerignore_follows_dockers_rules(path: str, ignored: bool) -> None:
    rules = ignore_rules((REPO / ".dockerignore").read_text())
    assert is_ignored(path, rules) is ignored


def test_dockerignore_last_match_wins_and_double_star_spans_directories() -> None:
    rules = ignore_rules("docs\n!docs/keep.md\n**/tmp/**\n/abs\n# comment\n\n")
    assert is_ignored("docs/x.md", rules)
    assert not is_ignored("docs/keep.md", rules)
    assert is_ignored("a/b/tmp/c/d", rules)
    assert is_ignored("tmp/c", rules)
    assert is_ignored("abs/x", rules)
    assert not is_ignored("abstract", rules)


def _context(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text("echo hi\n")
    (tmp_path / "scripts" / "__pycache__").mkdir()
    (tmp_path / "scripts" / "__pycache__" / "junk.pyc").write_bytes(b"x")
    (tmp_path / "package.yaml").write_text("name: p\nversion: 1.0.0\n")
    (tmp_path / "unused.txt").write_text("not copied\n")
    (tmp_path / ".dockerignore").write_text("**/__pycache__\n")
    return tmp_path


DOCKERFILE = "FROM busybox:1.37\nCOPY package.yaml /p/package.yaml\nCOPY scripts/ /p/scripts/\n"


def test_the_inputs_are_the_copied_files_minus_dockerignore(tmp_path: Path) -> None:
    context = _context(tmp_path)
    assert context_inputs(context, Dockerfile.parse(DOCKERFILE)) == ["package.yaml", "scripts/run.sh"]
    with pytest.raises(DockerfileError, match="not found in the build context"):
        context_inputs(context, Dockerfile.parse(DOCKERFILE + "COPY root/ /p/root/\n"))


def test_the_inputs_digest_moves_with_what_the_build_reads_and_only_with_that(tmp_path: Path) -> None:
    context = _context(tmp_path)
    extra = {"base:busybox:1.37": "id1"}
    first = inputs_digest(context, DOCKERFILE, extra)
    assert inputs_digest(context, DOCKERFILE, extra) == first
    (context / "unused.txt").write_text("changed\n")
    (context / "scripts" / "__pycache__" / "junk.pyc").write_bytes(b"changed")
    assert inputs_digest(context, DOCKERFILE, extra) == first, "files the build does not copy must not count"
    (context / "scripts" / "run.sh").write_text("echo changed\n")
    changed_file = inputs_digest(context, DOCKERFILE, extra)
    assert changed_file != first
    (context / "scripts" / "run.sh").chmod(0o755)
    assert inputs_digest(context, DOCKERFILE, extra) != changed_file, "the executable bit is an input"
    assert inputs_digest(context, DOCKERFILE, {"base:busybox:1.37": "id2"}) != inputs_digest(context, DOCKERFILE, extra)
    assert inputs_digest(context, DOCKERFILE + "# more\n", extra) != inputs_digest(context, DOCKERFILE, extra)


def test_the_project_dockerfile_reads_only_pyproject_readme_and_gate() -> None:
    parsed = Dockerfile.parse((REPO / "Dockerfile").read_text())
    inputs = context_inputs(REPO, parsed)
    assert "pyproject.toml" in inputs and "README.md" in inputs and "gate/__init__.py" in inputs
    assert all(p in ("pyproject.toml", "README.md") or p.startswith("gate/") for p in inputs)
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in inputs)


def test_targets_are_nodegate_then_every_package_tagged_with_its_version() -> None:
    found = targets(REPO)
    assert found[0].name == "nodegate" and found[0].dockerfile == REPO / "Dockerfile"
    import gate

    assert found[0].tag == gate.__version__
    packages = {t.name: t for t in found[1:]}
    assert set(packages) == {p.parent.name for p in (REPO / "packages").glob("*/Dockerfile")}
    for name, target in packages.items():
        assert (target.name, target.tag) == package_identity(REPO / "packages" / name / "package.yaml")
        assert target.repository == f"nodegate/{name}"


def test_package_identity_needs_a_name_and_a_version(tmp_path: Path) -> None:
    from gate.devcluster.build import BuildError

    (tmp_path / "package.yaml").write_text("name: x\n")
    with pytest.raises(BuildError, match="`name` and `version`"):
        package_identity(tmp_path / "package.yaml")


def test_references_name_the_gateway_address_and_the_digest() -> None:
    assert reference("10.213.7.1", 5123, "nodegate/sysctl-tuning", DIGEST) == \
        f"10.213.7.1:5123/nodegate/sysctl-tuning@{DIGEST}"
    with pytest.raises(ValueError, match="not a sha256 manifest digest"):
        reference("10.213.7.1", 5123, "nodegate/x", "sha256:short")
    assert local_name("nodegate", "f" * 64) == "localhost/nodegate/nodegate:" + "f" * 20


def test_the_printed_lines_put_nodegate_first_and_parse_back() -> None:
    refs = {"sysctl-tuning": f"h:1/nodegate/sysctl-tuning@{DIGEST}", "nodegate": f"h:1/nodegate/nodegate@{DIGEST}",
            "chrony-conf": f"h:1/nodegate/chrony-conf@{DIGEST}"}
    text = format_references(refs)
    assert text.splitlines()[0].startswith("nodegate=")
    assert [ln.split("=")[0] for ln in text.splitlines()] == ["nodegate", "chrony-conf", "sysctl-tuning"]
    assert parse_references(text) == refs
    with pytest.raises(ValueError, match="NAME=REFERENCE"):
        parse_references("nodegate h:1/nodegate/nodegate:0.1.0\n")


def test_the_registry_listens_on_every_address_in_plain_http_with_storage_in_the_cache(tmp_path: Path) -> None:
    config = registry_config(5123, tmp_path, "s3cret")
    assert config["http"]["addr"] == "0.0.0.0:5123"
    assert "tls" not in config["http"]
    assert config["storage"]["filesystem"]["rootdirectory"] == str(tmp_path)


def test_the_registry_is_pinned_with_the_other_components() -> None:
    registry = load_components()["registry"]
    assert registry.module == "github.com/distribution/distribution/v3"
    assert registry.version.startswith("v3.")
    assert registry.binaries == {"registry": "github.com/distribution/distribution/v3/cmd/registry"}
    assert f"-X {registry.module}/version.version={registry.version}" in registry.ldflags
