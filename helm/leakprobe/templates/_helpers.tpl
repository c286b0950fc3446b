{{/* The chart's name, or nameOverride. */}}
{{- define "leakprobe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A fully qualified app name, at most 63 characters (DNS names are limited to that). */}}
{{- define "leakprobe.fullname" -}}
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

{{- define "leakprobe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "leakprobe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leakprobe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "leakprobe.labels" -}}
helm.sh/chart: {{ include "leakprobe.chart" . }}
{{ include "leakprobe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: leakprobe
{{- end }}

{{- define "leakprobe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leakprobe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret that holds the tenants' API keys: the user's, or the one the chart creates. */}}
{{- define "leakprobe.tenantKeysSecret" -}}
{{- if .Values.tenantKeys.existingSecret }}
{{- .Values.tenantKeys.existingSecret }}
{{- else }}
{{- printf "%s-tenant-keys" (include "leakprobe.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "leakprobe.canaryKeySecret" -}}
{{- if .Values.canaryKey.existingSecret }}
{{- .Values.canaryKey.existingSecret }}
{{- else if .Values.canaryKey.create }}
{{- printf "%s-canary-key" (include "leakprobe.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The daemon's image: there is no public one; build it from the repository's Dockerfile and push it. */}}
{{- define "leakprobe.image" -}}
{{- $repository := required "image.repository: build the image from the repository's Dockerfile (make image), push it to a registry your cluster pulls from, and set image.repository (docs: Kubernetes, The image)" .Values.image.repository }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Whether the ledger is shared (PostgreSQL, from a Secret) rather than a SQLite file on the volume. */}}
{{- define "leakprobe.sharedLedger" -}}
{{- if .Values.ledger.existingSecret }}true{{ end }}
{{- end }}

{{/* The daemon's config file: values.config, with the ledger, listen address, key files and GPU filled in. */}}
{{- define "leakprobe.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $targets := list }}
{{- range $name, $target := .Values.config.targets }}
{{- $targets = append $targets (merge (dict "name" $name) (omit $target "name")) }}
{{- end }}
{{- $tenants := list }}
{{- range $name, $tenant := .Values.config.tenants }}
{{- $file := printf "/etc/leakprobe/tenant-keys/%s" (default $name $tenant.secretKey) }}
{{- $tenants = append $tenants (merge (dict "name" $name "api_key_file" $file) (omit $tenant "name" "secretKey" "api_key_env" "api_key_file")) }}
{{- end }}
{{- $_ := set $config "targets" $targets }}
{{- $_ := set $config "tenants" $tenants }}
{{- if include "leakprobe.sharedLedger" . }}
{{- $_ := unset $config "ledger" }}{{/* LEAKPROBE_LEDGER, from the ledger Secret */}}
{{- else }}
{{- $_ := set $config "ledger" "/var/lib/leakprobe/ledger.sqlite" }}
{{- end }}
{{- $daemon := deepCopy (default dict .Values.config.daemon) }}
{{- /* Every interface of the pod: the Service's, and the loopback `kubectl port-forward` reaches. */}}
{{- $_ := set $daemon "listen" (printf "0.0.0.0:%d" (int .Values.service.port)) }}
{{- if .Values.token.existingSecret }}
{{- $_ := set $daemon "token_file" "/etc/leakprobe/token/token" }}
{{- end }}
{{- $_ := set $config "daemon" $daemon }}
{{- if .Values.gpu.enabled }}
{{- $detection := deepCopy (default dict .Values.config.detection) }}
{{- $_ := set $detection "device" "cuda" }}
{{- $_ := set $detection "model" .Values.gpu.model }}
{{- $_ := set $config "detection" $detection }}
{{- end }}
{{- toYaml $config }}
{{- end }}
