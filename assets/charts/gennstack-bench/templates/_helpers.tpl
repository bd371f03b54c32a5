{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gennstack-bench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already holds the chart name. */}}
{{- define "gennstack-bench.fullname" -}}
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

{{- define "gennstack-bench.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gennstack-bench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gennstack-bench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gennstack-bench.labels" -}}
helm.sh/chart: {{ include "gennstack-bench.chart" . }}
{{ include "gennstack-bench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: benchmark
app.kubernetes.io/part-of: gennstack
{{- end }}

{{- define "gennstack-bench.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gennstack-bench.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The `gennstack bench` command line. */}}
{{- define "gennstack-bench.args" -}}
- bench
- --base-url
- {{ required "target.baseUrl is required: the gateway's OpenAI-compatible URL, e.g. https://<envoy service>.envoy-gateway-system.svc.cluster.local/v1" .Values.target.baseUrl | quote }}
- --model
- {{ required "target.model is required" .Values.target.model | quote }}
- --concurrency
- {{ .Values.bench.concurrency | toString | quote }}
{{- if gt (int .Values.bench.duration) 0 }}
- --duration
- {{ .Values.bench.duration | toString | quote }}
- --warmup-seconds
- {{ .Values.bench.warmupSeconds | toString | quote }}
{{- else }}
- --num-requests
- {{ required "bench.numRequests must be set when bench.duration is 0" .Values.bench.numRequests | toString | quote }}
{{- end }}
- --max-tokens
- {{ .Values.bench.maxTokens | toString | quote }}
- --prompt-tokens
- {{ .Values.bench.promptTokens | toString | quote }}
- --ramp-up
- {{ .Values.bench.rampUp | toString | quote }}
{{- if .Values.bench.ignoreEos }}
- --ignore-eos
{{- end }}
{{- if .Values.target.caConfigMap.name }}
{{- if not (hasPrefix "https://" .Values.target.baseUrl) }}
{{- fail (printf "target.caConfigMap.name needs an https:// target.baseUrl, not %q" .Values.target.baseUrl) }}
{{- end }}
- --ca-file
- /etc/gennstack-ca/ca.crt
{{- end }}
- --output-dir
- {{ printf "/results/%s" (default .Release.Name .Values.results.runName) | quote }}
- --upload
- {{ required "results.s3Uri is required: s3://BUCKET/PREFIX for the results" .Values.results.s3Uri | quote }}
- --no-progress
{{- range .Values.bench.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
