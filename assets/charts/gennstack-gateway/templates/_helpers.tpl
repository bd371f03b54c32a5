{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gennstack-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already holds the chart name. */}}
{{- define "gennstack-gateway.fullname" -}}
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

{{- define "gennstack-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gennstack-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gennstack-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gennstack-gateway.labels" -}}
helm.sh/chart: {{ include "gennstack-gateway.chart" . }}
{{ include "gennstack-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: gennstack
{{- end }}

{{/* Name of the Gateway, the AIGatewayRoute and the HTTPRoute the AI Gateway generates from it. */}}
{{- define "gennstack-gateway.gatewayName" -}}
{{- default (include "gennstack-gateway.fullname" .) .Values.gateway.name }}
{{- end }}

{{/* Object name of a backend (Backend and AIServiceBackend share it). */}}
{{- define "gennstack-gateway.backendName" -}}
{{- printf "%s-%s" (include "gennstack-gateway.fullname" .root) (.name | lower | replace "." "-" | replace ":" "-" | replace "/" "-" | replace "_" "-") | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gennstack-gateway.apiKeysSecret" -}}
{{- printf "%s-api-keys" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{- define "gennstack-gateway.langfuseSecret" -}}
{{- printf "%s-langfuse" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{- define "gennstack-gateway.redisName" -}}
{{- printf "%s-redis" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{/* The server certificate Envoy serves on the HTTPS listener (kubernetes.io/tls, with ca.crt). */}}
{{- define "gennstack-gateway.tlsSecret" -}}
{{- printf "%s-tls" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{/* The gateway CA's certificate and private key, kept so upgrades re-issue from the same CA. */}}
{{- define "gennstack-gateway.caKeySecret" -}}
{{- printf "%s-ca-key" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{/* The gateway CA's certificate only, for clients (a ConfigMap). */}}
{{- define "gennstack-gateway.caConfigMap" -}}
{{- printf "%s-ca" (include "gennstack-gateway.fullname" .) }}
{{- end }}
