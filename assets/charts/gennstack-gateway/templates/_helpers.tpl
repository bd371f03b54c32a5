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

{{- define "gennstack-gateway.apiKeysSecret" -}}
{{- printf "%s-api-keys" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{- define "gennstack-gateway.langfuseSecret" -}}
{{- printf "%s-langfuse" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{- define "gennstack-gateway.redisName" -}}
{{- printf "%s-redis" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{/* Name of the Gateway-wide BackendTrafficPolicy that holds the per-client rate limits. */}}
{{- define "gennstack-gateway.limitsPolicy" -}}
{{- printf "%s-limits" (include "gennstack-gateway.gatewayName" .) }}
{{- end }}

{{/* Name of the Redis password Secret (in the chart's namespace and the proxies'). */}}
{{- define "gennstack-gateway.redisAuthSecret" -}}
{{- printf "%s-redis-auth" (include "gennstack-gateway.fullname" .) }}
{{- end }}

{{/*
Retries and health checks of one HTTPRoute rule set: (dict "r" .Values.resilience "extraStatus" LIST
"prefix" .Values.prefixRouting-or-nothing); with "prefix", the consistent hash on the prefix key.
panicThreshold 0: Envoy never spreads traffic over unhealthy hosts (Envoy Gateway v1.8.3 sets the
cluster's healthy_panic_threshold only when the value is not Envoy's default, 50).
*/}}
{{- define "gennstack-gateway.backendTraffic" -}}
{{- $r := .r -}}
retry:
  numRetries: {{ $r.retries }}
  numAttemptsPerPriority: {{ $r.attemptsPerPriority }}
  perRetry:
    # The per-try timeout covers the whole response: it must not cut a long stream.
    timeout: {{ $r.requestTimeout }}
    backOff:
      baseInterval: 100ms
      maxInterval: 1s
  retryOn:
    triggers: [connect-failure, reset, retriable-status-codes]
    httpStatusCodes:
      {{- toYaml (concat $r.retryOnStatus .extraStatus) | nindent 6 }}
# Re-resolve a Service whose last answer was empty (no Ready pod) every dnsRefresh, not Envoy
# Gateway's 30 s: a replacement pod takes traffic within that of being Ready. Answers with addresses
# are refreshed at their TTL (respectDnsTtl).
dns:
  dnsRefreshRate: {{ required "resilience.dnsRefresh" $r.dnsRefresh }}
  respectDnsTtl: true
# Upstream connections are replaced after this (Envoy drains one: no new request on it, closed once
# its streams end), so keep-alive connections to a ClusterIP (gen1's Serve proxies) stop reaching a
# pod that left the Service (gennstack/gateway/envoy_common.py UPSTREAM_MAX_CONNECTION_S).
# Close an idle upstream connection before the model server's keep-alive does (vLLM's uvicorn: 5 s):
# a request written onto a connection the server is closing is reset (Envoy Gateway v1.8.3 writes this
# into the cluster's common_http_protocol_options.idle_timeout; its default is 1 h).
timeout:
  http:
    maxConnectionDuration: {{ required "resilience.maxConnectionDuration" $r.maxConnectionDuration }}
    connectionIdleTimeout: {{ required "resilience.upstreamIdleTimeout" $r.upstreamIdleTimeout }}
healthCheck:
  panicThreshold: 0
  active:
    type: HTTP
    interval: {{ $r.healthCheck.interval }}
    timeout: 2s
    unhealthyThreshold: {{ $r.healthCheck.unhealthyThreshold }}
    healthyThreshold: {{ $r.healthCheck.healthyThreshold }}
    http:
      path: {{ $r.healthCheck.path }}
      expectedStatuses: [200]
  passive:
    consecutive5XxErrors: {{ $r.outlier.consecutive5xx }}
    consecutiveGatewayErrors: {{ $r.outlier.consecutiveGatewayErrors }}
    splitExternalLocalOriginErrors: true
    # more than one reset, connect failure or silent attempt in a row: one keep-alive race ejects nobody
    consecutiveLocalOriginFailures: {{ required "resilience.outlier.consecutiveLocalOriginFailures" $r.outlier.consecutiveLocalOriginFailures }}
    interval: 2s
    # every ejection lasts this long, repeats too (the EnvoyPatchPolicy sets max_ejection_time to it)
    baseEjectionTime: {{ $r.outlier.baseEjectionTime }}
    # outlier ejection alone takes at most this share of the rule's servers (Envoy counts the overflow);
    # Envoy counts servers failing health checks in it too, so it may still take the last healthy one
    maxEjectionPercent: {{ required "resilience.outlier.maxEjectionPercent" $r.outlier.maxEjectionPercent }}
{{- with .prefix }}
# Envoy Gateway v1.8.3 makes this Maglev (table 65537) with a header hash policy on the route.
loadBalancer:
  type: ConsistentHash
  consistentHash:
    type: Headers
    headers:
      - name: {{ required "prefixRouting.keyHeader" .keyHeader }}
{{- end }}
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

{{/*
The Gateway the model routes (AIGatewayRoute, their policies, patches and the prefix key) attach to:
with stream resume on, the cluster-internal routing Gateway behind the relay; otherwise the public one.
*/}}
{{- define "gennstack-gateway.routingGateway" -}}
{{- if .Values.resume.enabled }}
{{- default (printf "%s-routing" (include "gennstack-gateway.gatewayName" .)) .Values.resume.routing.name }}
{{- else }}
{{- include "gennstack-gateway.gatewayName" . }}
{{- end }}
{{- end }}

{{/* The routing Gateway's listener the EnvoyPatchPolicy's local replies go to. */}}
{{- define "gennstack-gateway.routingListener" -}}
{{- if .Values.resume.enabled }}{{ .Values.resume.routing.listener }}{{ else }}{{ .Values.envoyPatches.listener }}{{ end }}
{{- end }}

{{/* The relay's Deployment, Service, ConfigMap, PodDisruptionBudget and PodMonitor. */}}
{{- define "gennstack-gateway.resumeName" -}}
{{- printf "%s-resume" (include "gennstack-gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The AIGatewayRoute (and the HTTPRoute generated from it) of the public Gateway, to the relay. */}}
{{- define "gennstack-gateway.frontRoute" -}}
{{- printf "%s-front" (include "gennstack-gateway.gatewayName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gennstack-gateway.resumeSelectorLabels" -}}
{{ include "gennstack-gateway.selectorLabels" . }}
app.kubernetes.io/component: resume-relay
{{- end }}
