{{/*
Names. NodeGate is one per cluster (its CRDs, webhook configurations and ClusterRoles are
cluster-scoped), so names do not carry the release name: every object is "<fullname>-<part>",
fullname "nodegate" unless fullnameOverride says otherwise. The defaults are the names the
processes use when nothing is configured (gate/controller/settings.py, gate/admission/settings.py).
*/}}
{{- define "nodegate.fullname" -}}
{{- .Values.fullnameOverride | default "nodegate" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodegate.operatorName" -}}{{ include "nodegate.fullname" . }}-operator{{- end -}}
{{- define "nodegate.packageServiceAccount" -}}{{ include "nodegate.fullname" . }}-package{{- end -}}
{{- define "nodegate.webhookName" -}}{{ include "nodegate.fullname" . }}-webhook{{- end -}}
{{- define "nodegate.preDeleteName" -}}{{ include "nodegate.fullname" . }}-pre-delete{{- end -}}
{{/* Both webhook configurations carry this name (the webhook patches their caBundle by it). */}}
{{- define "nodegate.webhookConfigurationName" -}}{{ include "nodegate.fullname" . }}{{- end -}}
{{/* Self-managed: the Secret the webhook keeps its CA and serving certificate in.
     cert-manager: the Secret the Certificate writes. */}}
{{- define "nodegate.webhookSecretName" -}}{{ include "nodegate.fullname" . }}-webhook-tls{{- end -}}
{{- define "nodegate.stateKeySecretName" -}}{{ include "nodegate.fullname" . }}-state-key{{- end -}}
{{- define "nodegate.certificateName" -}}{{ include "nodegate.fullname" . }}-webhook{{- end -}}
{{- define "nodegate.operatorUsername" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "nodegate.operatorName" . }}
{{- end -}}

{{/* The Service's DNS names: the SANs of the serving certificate in both certificate modes. */}}
{{- define "nodegate.webhookHosts" -}}
{{- $svc := include "nodegate.webhookName" . -}}
{{- $ns := .Release.Namespace -}}
{{ $svc }},{{ $svc }}.{{ $ns }},{{ $svc }}.{{ $ns }}.svc,{{ $svc }}.{{ $ns }}.svc.{{ .Values.clusterDomain }}
{{- end -}}

{{/* One image for the webhook, the operator and the agent in package pods. */}}
{{- define "nodegate.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "nodegate.selectorLabels" -}}
app.kubernetes.io/name: nodegate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "nodegate.labels" -}}
{{- $ctx := .ctx -}}
{{ include "nodegate.selectorLabels" $ctx }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: nodegate
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "nodegate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "nodegate.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
Pods of the operator and the webhook tolerate NodeGate's readiness taint: when every node joins
tainted (a readinessTaint gate selecting all of them), the operator must still run to lift it.
*/}}
{{- define "nodegate.tolerations" -}}
- key: nodegate.io/runtime-required
  operator: Exists
  effect: NoSchedule
{{- with . }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Refuse configurations that cannot work, with a message a person can act on. */}}
{{- define "nodegate.validate" -}}
{{- if eq .Release.Namespace "default" -}}
{{- fail "NodeGate does not install into the \"default\" namespace: its webhooks exclude their own namespace and it runs privileged package pods there. Use a namespace of its own, e.g. `helm install nodegate charts/nodegate -n nodegate-system --create-namespace` (or `helm template charts/nodegate -n nodegate-system`)." -}}
{{- end -}}
{{- include "nodegate.validateKubeVersion" . -}}
{{- $op := .Values.operator.leaderElection -}}
{{- if not (and (lt (float64 $op.renewSeconds) (float64 $op.renewDeadlineSeconds)) (lt (float64 $op.renewDeadlineSeconds) (float64 $op.leaseSeconds))) -}}
{{- fail "operator.leaderElection: need renewSeconds < renewDeadlineSeconds < leaseSeconds" -}}
{{- end -}}
{{- if and .Values.certManager.enabled .Values.certManager.issuerRef.name (not .Values.certManager.issuerRef.kind) -}}
{{- fail "certManager.issuerRef.kind is required with certManager.issuerRef.name" -}}
{{- end -}}
{{- include "nodegate.requireCertManager" . -}}
{{- end -}}

{{/*
certManager.enabled needs cert-manager's API: without its CRDs `helm install` would fail on the
first Issuer with Helm's "no matches for kind" and leave nothing said about why. Against a cluster
(install, upgrade, --dry-run=server) .Capabilities come from its discovery; `helm template` and
--dry-run=client ask no cluster, and there `lookup` returns nothing, so only a cluster is checked.
*/}}
{{- define "nodegate.requireCertManager" -}}
{{- if and .Values.certManager.enabled (lookup "v1" "Namespace" "" "kube-system") -}}
{{- $missing := list -}}
{{- range $kind := list "Certificate" "Issuer" -}}
{{- if not ($.Capabilities.APIVersions.Has (printf "cert-manager.io/v1/%s" $kind)) -}}
{{- $missing = append $missing (printf "cert-manager.io/v1 %s" $kind) -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "certManager.enabled=true needs cert-manager, and this cluster does not serve %s (cert-manager's CRDs are not installed). Install cert-manager first (https://cert-manager.io/docs/installation/), or leave certManager.enabled=false for self-managed certificates." (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* clientConfig of a webhook: the Service; caBundle is set at run time (self-managed webhook or
     cert-manager's cainjector), never by the chart, so `helm upgrade` leaves it alone. */}}
{{- define "nodegate.webhookClient" -}}
clientConfig:
  service:
    name: {{ include "nodegate.webhookName" .ctx }}
    namespace: {{ .ctx.Release.Namespace }}
    path: {{ .path }}
    port: 443
{{- end -}}

{{/* What every webhook has: no side effects, v1 reviews, and the release's namespace and
     kube-system left out (a guard for namespaced kinds; NodeGate's three kinds are cluster-scoped). */}}
{{- define "nodegate.webhookCommon" -}}
sideEffects: None
admissionReviewVersions: [v1]
matchPolicy: Equivalent
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: [{{ join ", " . }}]
{{- end -}}

{{/* Egress of NodeGate's pods: DNS, and the API server on its ports (its address is not known
     to the chart; Kubernetes NetworkPolicy cannot name "the API server"). */}}
{{- define "nodegate.egress" -}}
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
- ports:
    {{- range .Values.networkPolicy.apiServerPorts }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- end -}}

{{/*
The supported Kubernetes range (Chart.yaml's annotation nodegate.io/kube-version), checked here
instead of by Chart.yaml's kubeVersion, which Helm checks before rendering and so also against its
own default when no cluster is asked. That default is Helm's DefaultCapabilities: a compiled-in
version (v1.20.0 in a helm built without the release's ldflags, as from `go install`) next to every
group-version of the client-go it was built with. A real v1.20.0 server never served
flowcontrol.apiserver.k8s.io/v1 (GA in 1.29), so that pair is Helm's default, not a cluster: it
renders (`helm template charts/nodegate` must work for GitOps pipelines). Every other version,
from a cluster or from --kube-version, must satisfy the range: below 1.30 the API server would drop
the webhooks' matchConditions silently and the operator could not lift its own taint.
*/}}
{{- define "nodegate.validateKubeVersion" -}}
{{- $range := index .Chart.Annotations "nodegate.io/kube-version" -}}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- $helmDefault := and (eq $version "v1.20.0") (.Capabilities.APIVersions.Has "flowcontrol.apiserver.k8s.io/v1") -}}
{{- if and (not $helmDefault) (not (semverCompare $range $version)) -}}
{{- fail (printf "NodeGate needs Kubernetes %s; this cluster (or --kube-version) is %s. With `helm template`, pass the target cluster's version: --kube-version 1.35" $range $version) -}}
{{- end -}}
{{- end -}}

{{/*
The operator's requests and limits: operator.resources when set, else computed from the fleet
(the formula and the measurements behind it: values.yaml, key fleet). s is the number of node
rollouts at the benchmark's 3 packages per node.
*/}}
{{- define "nodegate.operatorResources" -}}
{{- if .Values.operator.resources -}}
{{ toYaml .Values.operator.resources }}
{{- else -}}
{{- $s := mulf (float64 .Values.fleet.nodes) (divf (float64 .Values.fleet.packages) 3.0) -}}
{{- $memory := mul (int (ceil (divf (addf 98.0 (mulf $s 0.01827)) 16.0))) 16 -}}
{{- $cpu := max 100 (mul (int (ceil (divf (mulf $s 56.0) 6000.0))) 10) -}}
requests:
  cpu: {{ $cpu }}m
  memory: {{ $memory }}Mi
limits:
  memory: {{ max 512 (mul $memory 2) }}Mi
{{- end -}}
{{- end -}}

{{/*
The operator's Prometheus endpoints file (gate/controller/endpoints.py), from
operator.health.prometheus.endpoints: each Secret a value names is mounted at
/etc/nodegate/prometheus/<name>/ (ca.crt, token), and the file names those paths.
*/}}
{{- define "nodegate.prometheusEndpoints" -}}
{{- $out := dict -}}
{{- range $name, $ep := .Values.operator.health.prometheus.endpoints -}}
{{- $e := dict "url" $ep.url -}}
{{- $tls := $ep.tls | default dict -}}
{{- if $tls.caSecret -}}{{- $_ := set $e "caFile" (printf "/etc/nodegate/prometheus/%s/ca.crt" $name) -}}{{- end -}}
{{- if $tls.insecureSkipVerify -}}{{- $_ := set $e "insecureSkipVerify" true -}}{{- end -}}
{{- if $ep.bearerTokenSecret -}}{{- $_ := set $e "bearerTokenFile" (printf "/etc/nodegate/prometheus/%s/token" $name) -}}{{- end -}}
{{- $_ := set $out $name $e -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
NetworkPolicy peers for "any address but the link-local and cloud metadata ones" (what the operator's
own checks refuse too: gate/controller/egress.py).
*/}}
{{- define "nodegate.publicPeers" -}}
- ipBlock:
    cidr: 0.0.0.0/0
    except: [169.254.0.0/16, 100.100.100.200/32]
- ipBlock:
    cidr: ::/0
    except: ["fe80::/10", "fd00:ec2::254/128"]
{{- end -}}

{{/*
"true" when the operator gets an image signature policy (operator.imageSignatures): some rule, or
unmatched: refuse. With neither, no image would ever be judged, and no policy is rendered.
*/}}
{{- define "nodegate.imageSignaturesOn" -}}
{{- $p := .Values.operator.imageSignatures -}}
{{- if or $p.rules (eq $p.unmatched "refuse") -}}true{{- end -}}
{{- end -}}
