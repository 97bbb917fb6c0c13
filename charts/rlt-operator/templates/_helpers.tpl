{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "rlt-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: <release>-rlt-operator unless the release name already contains the chart name. */}}
{{- define "rlt-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rlt-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object of the release. */}}
{{- define "rlt-operator.labels" -}}
helm.sh/chart: {{ include "rlt-operator.chart" . }}
{{ include "rlt-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rlt
{{- end }}

{{/* Labels that select the operator pod (never change them in an upgrade: Deployment selectors are immutable). */}}
{{- define "rlt-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlt-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rlt-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlt-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rlt-operator.image" -}}
{{- if hasPrefix "ghcr.io/rlt-dev/" .Values.image.repository }}
{{- fail (printf "image.repository is %s, a placeholder: no rlt image is published. Build and push the images (make images IMAGE_REGISTRY=<registry>, then push them), then set --set image.repository=<registry>/rlt-operator (docs/install.md)" .Values.image.repository) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* True (non-empty) when the operator watches a fixed list of namespaces. */}}
{{- define "rlt-operator.namespaced" -}}
{{- if .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{/* True (non-empty) when the prometheus-operator API is served by the cluster. */}}
{{- define "rlt-operator.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Arguments of `rlt operator`: the namespaces to watch (or all of them), then the user's extras. */}}
{{- define "rlt-operator.args" -}}
{{- if .Values.operator.watchNamespaces }}
{{- range .Values.operator.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if .Values.operator.peering.enabled }}
- --peering={{ include "rlt-operator.peeringName" . }}
- --peering-lifetime={{ .Values.operator.peering.lifetime }}
- --lease-duration={{ .Values.operator.leaderElection.leaseDuration }}
- --renew-deadline={{ .Values.operator.leaderElection.renewDeadline }}
- --retry-period={{ .Values.operator.leaderElection.retryPeriod }}
{{- end }}
{{- if eq .Values.operator.logLevel "verbose" }}
- --verbose
{{- else if eq .Values.operator.logLevel "debug" }}
- --debug
{{- else if eq .Values.operator.logLevel "quiet" }}
- --quiet
{{- end }}
{{- if eq .Values.operator.logFormat "json" }}
- --log-format=json
{{- end }}
{{- with .Values.operator.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Name of the Kopf peering object(s) the replicas share. */}}
{{- define "rlt-operator.peeringName" -}}
{{- default (include "rlt-operator.fullname" .) .Values.operator.peering.name }}
{{- end }}
