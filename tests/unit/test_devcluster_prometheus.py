"""The dev cluster's Prometheus configuration (gate/devcluster/prometheus.py): fast, static, valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.devcluster.prometheus import prometheus_argv, prometheus_config


def test_one_interval_drives_scrapes_timeouts_and_rules() -> None:
    config = prometheus_config(["127.0.0.1:9100", "127.0.0.1:9200"], interval=1.5, rule_files=["/s/rules.yml"])
    # The scrape timeout may not exceed the interval (Prometheus refuses it; its default is 10 s).
    assert config["global"] == {"scrape_interval": "1500ms", "scrape_timeout": "1500ms",
                                "evaluation_interval": "1500ms"}
    assert config["rule_files"] == ["/s/rules.yml"]
    [job] = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9100", "127.0.0.1:9200"]}]


@pytest.mark.parametrize("interval", [0, -1, 0.0001])
def test_an_interval_that_is_no_positive_duration_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match="interval must be positive"):
        prometheus_config([], interval=interval)


def test_it_listens_on_loopback_only() -> None:
    argv = prometheus_argv(Path("/bin/prometheus"), Path("/s/p.yml"), Path("/s/data"), 9090)
    assert "--web.listen-address=127.0.0.1:9090" in argv
    assert "--config.file=/s/p.yml" in argv and "--storage.tsdb.path=/s/data" in argv
