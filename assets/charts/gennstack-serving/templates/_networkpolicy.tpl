{{/*
A NetworkPolicy peer in another namespace: (dict "namespace" <name> "podLabels" <labels>), the
networkPolicy.<dns|gateway|prometheus|kuberay> values. The namespace by its name label
(kubernetes.io/metadata.name, which Kubernetes sets on every namespace).
*/}}
{{- define "gennstack-serving.peer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .namespace }}
  podSelector:
    matchLabels:
      {{- toYaml .podLabels | nindent 6 }}
{{- end }}

{{/* gen1-inf2's Ray pods, head and workers (their pod templates' labels, which KubeRay v1.7.0 keeps:
ray-operator/controllers/ray/common/pod.go labelPod lets a template's labels override its own). */}}
{{- define "gennstack-serving.gen1RayPods" -}}
matchExpressions:
  - key: app.kubernetes.io/name
    operator: In
    values: ["gen1-inf2"]
  - key: app.kubernetes.io/component
    operator: In
    values: ["ray-head", "server"]
{{- end }}

{{/* The members of one multi-node group: (dict "lws" <LeaderWorkerSet name> "group" <index>). */}}
{{- define "gennstack-serving.lwsGroup" -}}
matchLabels:
  leaderworkerset.sigs.k8s.io/name: {{ .lws }}
  leaderworkerset.sigs.k8s.io/group-index: {{ .group | toString | quote }}
{{- end }}
