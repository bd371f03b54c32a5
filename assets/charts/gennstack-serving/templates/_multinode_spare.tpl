{{/*
The pod template of a warm-spare group's members (templates/multinode-warm-spare.yaml), leader and
workers alike. Call with (dict "root" $ "ctx" $ctx "m" .Values.multiNode "staged" (multiNodeGen) "cpu" "memory").
*/}}
{{- define "gennstack-serving.multiNodeSparePod" -}}
{{- $root := .root }}{{- $ctx := .ctx }}{{- $m := .m }}{{- $gen := $ctx.gen }}
metadata:
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
    {{- include "gennstack-serving.selectorLabels" $ctx | nindent 4 }}
    {{- include "gennstack-serving.stagedLabel" (dict "root" $root "gen" .staged) | nindent 4 }}
spec:
  # Idle pods call no API: the namespace's default account, without a token.
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    seccompProfile:
      type: RuntimeDefault
  priorityClassName: {{ $root.Values.priorityClasses.warmSpare.name }}
  # Preempted spares only idle: no need to wait.
  terminationGracePeriodSeconds: 5
  {{- include "gennstack-serving.placement" $ctx | nindent 2 }}
  {{- /* The multi-node model's staging gate, as its serving groups. */}}
  {{- include "gennstack-serving.schedulingGates" (dict "root" $root "gen" .staged) | nindent 2 }}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - key: node.kubernetes.io/instance-type
                operator: In
                values: [{{ $m.instanceType | quote }}]
    # One spare member a node, as one serving member a node.
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "gennstack-serving.selectorLabels" $ctx | nindent 14 }}
      # Out of the serving groups' zones (gennstack-serving.spareAntiAffinityTerms), naming their namespace (the
      # release's): a term without one sees only this namespace. The leader's term places the group: LWS v0.10.0's
      # exclusive-topology webhook appends its own required terms to the leader and pins the workers to its zone.
      preferredDuringSchedulingIgnoredDuringExecution:
        {{- include "gennstack-serving.spareAntiAffinityTerms" (dict "gen" $gen "namespaces" (list $root.Release.Namespace)) | nindent 8 }}
  containers:
    # The serving image, so the node has it pulled; idles holding a member's GPUs, CPU and memory.
    - name: idle
      image: {{ $gen.image }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["sleep", "infinity"]
      resources:
        requests:
          cpu: {{ .cpu | quote }}
          memory: {{ .memory }}
          {{ $gen.resource }}: {{ $m.gpusPerNode | quote }}
        limits:
          memory: {{ .memory }}
          {{ $gen.resource }}: {{ $m.gpusPerNode | quote }}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
{{- end }}
