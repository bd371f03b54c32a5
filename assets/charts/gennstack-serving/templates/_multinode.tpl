{{/*
The multi-node model as the staging templates see a generation (the stage Job, its marker, the
group pods' gate): name `multiNode` (its values: modelId, revision, staged), pool
`<generation's pool>-multinode`, never Neuron (so no compile Job; its gate needs the weights only).
Call with the root context; use with fromYaml.
*/}}
{{- define "gennstack-serving.multiNodeGen" -}}
{{- $m := .Values.multiNode }}
{{- $base := fromYaml (include "gennstack-serving.gen" (dict "root" . "name" $m.generation)) }}
name: multiNode
pool: {{ printf "%s-multinode" $base.pool }}
neuron: false
{{- /* The prefix the leader streams from (multiNode.modelPrefix, CDK's gennstack/storage_layout.py key). */}}
modelPrefix: {{ $m.modelPrefix }}
{{- end }}

{{/*
The LeaderWorkerSet annotation that keeps each group in one zone and each zone to one group (the
serving groups, templates/multinode-lws.yaml; the warm spares among themselves,
templates/multinode-warm-spare.yaml). LWS v0.10.0 reads it from the LeaderWorkerSet object only, never
from a pod template (kubernetes-sigs/lws v0.10.0):
* pkg/controllers/pod_controller.go: `if topologyKey, found := leaderWorkerSet.Annotations[...]`: the
  workers' StatefulSet is created only once the leader is scheduled, with a nodeSelector on the
  leader node's value of the key (setNodeSelectorForWorkerPods).
* pkg/controllers/leaderworkerset_controller.go (leader StatefulSet) and pod_controller.go (worker
  StatefulSet) copy `lws.Annotations[ExclusiveKeyAnnotationKey]` onto the pods; pkg/webhooks/pod_webhook.go
  then gives the leader (the leader only) a required pod affinity to its group (group-key In [own]) and
  a required anti-affinity to any other group's pods (group-key Exists, NotIn [own]) on that key.
On a pod template alone the leaders got the (anti-)affinity but the workers no zone at all: a group
could span zones, and a stray worker, placed before the other leaders, could hold a zone one of them
needed (one group per zone) and leave that group Pending.
*/}}
{{- define "gennstack-serving.exclusiveZone" -}}
leaderworkerset.sigs.k8s.io/exclusive-topology: topology.kubernetes.io/zone
{{- end }}

{{/*
The pod template of a multi-node group's leader or worker (templates/multinode-lws.yaml). Call with
(dict "root" $ "ctx" $ctx "m" .Values.multiNode "role" "leader|worker" "args" (vLLM args) "cpu" "memory" "checksum").
*/}}
{{- define "gennstack-serving.multiNodePod" -}}
{{- $root := .root }}{{- $ctx := .ctx }}{{- $m := .m }}{{- $gen := $ctx.gen }}
{{- $leader := eq .role "leader" }}
{{- $staged := fromYaml (include "gennstack-serving.multiNodeGen" $root) }}
metadata:
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
    {{- include "gennstack-serving.selectorLabels" $ctx | nindent 4 }}
    {{- include "gennstack-serving.routableLabel" $root | nindent 4 }}
    gennstack.io/multinode-role: {{ .role }}
    {{- include "gennstack-serving.stagedLabel" (dict "root" $root "gen" $staged) | nindent 4 }}
  annotations:
    # One zone per group, one group per zone: the exclusive-topology annotation is on the
    # LeaderWorkerSet itself (templates/multinode-lws.yaml), which LWS copies onto these pods.
    # Kept for the pod's life: Karpenter never consolidates or drifts a member away on its own,
    # since losing any member costs the whole replica. Spot reclaims still do (docs/serving.md).
    karpenter.sh/do-not-disrupt: "true"
    checksum/scripts: {{ .checksum }}
spec:
  serviceAccountName: {{ $root.Values.serviceAccounts.serving.name }}
  priorityClassName: {{ $root.Values.priorityClasses.serving.name }}
  terminationGracePeriodSeconds: {{ $root.Values.spot.terminationGracePeriodSeconds }}
  {{- include "gennstack-serving.podSecurity" $ctx | nindent 2 }}
  {{- include "gennstack-serving.placement" $ctx | nindent 2 }}
  {{- /* The staging gate of the other servers, read from multiNode.staged and the marker of this model. */}}
  {{- include "gennstack-serving.schedulingGates" (dict "root" $root "gen" $staged) | nindent 2 }}
  {{- /* placement's nodeSelector, plus the one instance type every member must be. */}}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - key: node.kubernetes.io/instance-type
                operator: In
                values: [{{ $m.instanceType | quote }}]
    # Every member on a node of its own (each takes all of a node's GPUs anyway).
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "gennstack-serving.selectorLabels" $ctx | nindent 14 }}
  containers:
    - name: {{ ternary "vllm" "ray-worker" $leader }}
      image: {{ $gen.image }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["python3", "/scripts/multinode_bootstrap.py", {{ .role | quote }}]
      env:
        {{- include "gennstack-serving.awsEnv" $ctx | nindent 8 }}
        # Nothing from the internet on the serving path.
        - name: HF_HUB_OFFLINE
          value: "1"
        {{- include "gennstack-serving.vllmUserEnv" $ctx | nindent 8 }}
        - name: RAY_USAGE_STATS_ENABLED
          value: "0"
        # Ray token authentication (Ray 2.60: off unless RAY_AUTH_MODE=token, then every GCS and
        # dashboard call needs RAY_AUTH_TOKEN; _private/authentication/authentication_token_setup.py,
        # the names KubeRay v1.7.0 sets for gen1, utils/constant.go). The bootstrap refuses to start
        # Ray without them; vLLM (the leader's Ray driver) inherits them.
        - name: RAY_AUTH_MODE
          value: token
        - name: RAY_AUTH_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ printf "%s-ray-auth" $gen.pool }}
              key: auth_token
        - name: RAY_PORT
          value: {{ $m.rayPort | quote }}
        - name: GROUP_TIMEOUT_SECONDS
          value: {{ $m.groupTimeoutSeconds | quote }}
        # Ray's object store lives in /dev/shm (the dshm volume, 16Gi): keep it well inside that.
        - name: RAY_START_ARGS
          value: '["--object-store-memory=8000000000"]'
        {{- if $leader }}
        - name: VLLM_ARGS
          value: {{ toJson .args | quote }}
        {{- end }}
      ports:
        {{- if $leader }}
        - name: http
          containerPort: 8000
        {{- end }}
        - name: ray
          containerPort: {{ $m.rayPort }}
      {{- if $leader }}
      {{- include "gennstack-serving.probes" (dict "path" "/health" "port" "http" "timeout" $m.startupTimeoutSeconds) | nindent 6 }}
      {{- include "gennstack-serving.lifecycle" $ctx | nindent 6 }}
      {{- end }}
      resources:
        requests:
          cpu: {{ .cpu | quote }}
          memory: {{ .memory }}
          {{ $gen.resource }}: {{ $m.gpusPerNode | quote }}
        limits:
          memory: {{ .memory }}
          {{ $gen.resource }}: {{ $m.gpusPerNode | quote }}
      {{- include "gennstack-serving.containerSecurity" (dict "user" "vllm") | nindent 6 }}
      volumeMounts:
        - name: scripts
          mountPath: /scripts
          readOnly: true
        - name: cache
          mountPath: /cache
          readOnly: true
        - name: dshm
          mountPath: /dev/shm
        - name: home
          mountPath: /home/vllm
  volumes:
    {{- include "gennstack-serving.volumes" $ctx | nindent 4 }}
{{- end }}
