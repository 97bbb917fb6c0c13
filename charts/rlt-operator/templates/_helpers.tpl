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

{{/* "true" where the chart makes the operator's ServiceMonitor (the scrape job="rlt-operator"), else empty: it
needs the metrics Service and the monitoring API too. servicemonitor.yaml, RLTOperatorDown's rule and the notes. */}}
{{- define "rlt-operator.makesServiceMonitor" -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.service.enabled (include "rlt-operator.hasMonitoringApi" .) }}true{{ end }}
{{- end }}

{{/* Arguments of `rlt operator`: the namespaces to watch (or all of them), then the user's extras. */}}
{{- define "rlt-operator.args" -}}
{{- if .Values.operator.watchNamespaces }}
{{- range .Values.operator.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else if not (include "rlt-operator.extraNamespaceArg" .) }}
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

{{/* The first of operator.extraArgs that names a namespace (a glob pattern: the schema keeps watchNamespaces to
names), or "". `rlt operator` takes --namespace or --all-namespaces, not both. */}}
{{- define "rlt-operator.extraNamespaceArg" -}}
{{- range .Values.operator.extraArgs }}
{{- if regexMatch "^(--namespace|-n)(=|$)" . }}{{ . }}{{ break }}{{ end }}
{{- end }}
{{- end }}

{{/* Name of the Kopf peering object(s) the replicas share. */}}
{{- define "rlt-operator.peeringName" -}}
{{- default (include "rlt-operator.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{/* The metrics Service's name: room kept for "-metrics" within the 63 characters, and a DNS-1035 label (a Service
name starts with a letter and has no dots, which a release name may). */}}
{{- define "rlt-operator.metricsServiceName" -}}
{{- $name := printf "%s-metrics" (include "rlt-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "the metrics Service would be named %q, not a DNS-1035 label (a letter first, no dots): it comes from the release name; set fullnameOverride" $name) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* Values the schema accepts one by one but not together, refused at render naming them: otherwise the operator
exits at start (crash loop), two servers fight over one port, or a label or an alert setting is silently lost. */}}
{{- define "rlt-operator.checks" -}}
{{- $o := .Values.operator }}
{{- if and (gt (int $o.replicas) 1) (not $o.peering.enabled) }}
{{- fail "operator.replicas > 1 needs operator.peering.enabled: unpeered replicas would all reconcile the same runs" }}
{{- end }}
{{- if $o.peering.enabled }}
{{- $le := $o.leaderElection }}
{{- if not (and (lt (float64 $le.retryPeriod) (float64 $le.renewDeadline)) (lt (float64 $le.renewDeadline) (float64 $le.leaseDuration)) (lt (float64 $le.leaseDuration) 3600.0)) }}
{{- fail (printf "operator.leaderElection: retryPeriod (%v) < renewDeadline (%v) < leaseDuration (%v) < 3600 seconds is required: the leader must stop acting before another replica may take the lease (client-go's rule; rlt operator exits 2 otherwise)" $le.retryPeriod $le.renewDeadline $le.leaseDuration) }}
{{- end }}
{{- end }}
{{- with include "rlt-operator.extraNamespaceArg" . }}
{{- if $o.peering.enabled }}
{{- fail (printf "operator.extraArgs: %s needs operator.peering.enabled=false and operator.replicas=1: a --namespace operator peers through a KopfPeering in each namespace it watches, which the chart cannot create for a pattern" .) }}
{{- end }}
{{- end }}
{{- range $o.extraArgs }}
{{- if and $.Values.rbac.create (eq (regexReplaceAll "=.*" . "") "--peering") }}
{{- fail (printf "operator.extraArgs: %s: the peering's name is operator.peering.name (the Lease the replicas elect by is named after it, and the chart's Role grants that Lease only)" .) }}
{{- end }}
{{- end }}
{{- if and .Values.rbac.create (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.create=false needs serviceAccount.name: without it the operator's RBAC would be bound to the namespace's \"default\" account, which every pod there runs as" }}
{{- end }}
{{- if eq (int $o.metricsPort) (int $o.healthPort) }}
{{- fail (printf "operator.metricsPort and operator.healthPort are both %v: the metrics server and /healthz each need a port" $o.metricsPort) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes the metrics Service" }}
{{- end }}
{{- $own := include "rlt-operator.labels" . | fromYaml }}
{{- range $key, $_ := .Values.podLabels }}
{{- if hasKey $own $key }}
{{- fail (printf "podLabels.%s: the chart sets this label on the pod itself (the Deployment's selector or its standard labels)" $key) }}
{{- end }}
{{- end }}
{{- $alerts := dict }}
{{- $rules := dict }}
{{- range $group := (.Files.Get "files/alerts/rlt-alerts.yaml" | fromYaml).groups }}
{{- range $rule := $group.rules }}
{{- if $rule.alert }}
{{- $_ := set $alerts $rule.alert true }}
{{- range $key, $_ := (default dict $rule.labels) }}{{- $_ := set $rules $key $rule.alert }}{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $_ := .Values.prometheusRule.for }}
{{- if not (hasKey $alerts $name) }}
{{- fail (printf "prometheusRule.for.%s: no such alert (the alerts: %s)" $name (keys $alerts | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- range $key, $_ := .Values.prometheusRule.extraAlertLabels }}
{{- if hasKey $rules $key }}
{{- fail (printf "prometheusRule.extraAlertLabels.%s: the alerts set this label themselves (e.g. %s); the extra labels are added beside theirs" $key (get $rules $key)) }}
{{- end }}
{{- end }}
{{- end }}
