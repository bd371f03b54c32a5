{{/* Chart name and version, as the helm.sh/chart label wants them. */}}
{{- define "gennstack-serving.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gennstack-serving.labels" -}}
helm.sh/chart: {{ include "gennstack-serving.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gennstack
{{- end }}

{{/*
The fixed facts of one generation, as YAML: NodePool name (which names its objects), node label,
taint and accelerator resource. Call with (dict "root" $ "name" "inf2") and read with fromYaml.
*/}}
{{- define "gennstack-serving.gen" -}}
{{- $v := index .root.Values .name -}}
{{- $facts := dict
  "inf2" (dict "pool" "gen1-inf2" "neuron" true "taint" "aws.amazon.com/neuron" "resource" "aws.amazon.com/neuron" "image" .root.Values.images.neuronVllm)
  "trn2" (dict "pool" "gen2-trn2" "neuron" true "taint" "aws.amazon.com/neuron" "resource" "aws.amazon.com/neuron" "image" .root.Values.images.neuronVllm)
  "g6e" (dict "pool" "gen3-g6e" "neuron" false "taint" "nvidia.com/gpu" "resource" "nvidia.com/gpu" "image" .root.Values.images.vllm) -}}
{{- $f := index $facts .name -}}
name: {{ .name }}
pool: {{ $f.pool }}
neuron: {{ $f.neuron }}
taint: {{ $f.taint }}
resource: {{ $f.resource }}
count: {{ ternary $v.neuronChips $v.gpusPerReplica $f.neuron }}
image: {{ default $f.image $v.image }}
modelPrefix: {{ printf "%s/%s/" $v.modelId $v.revision }}
{{- if $f.neuron }}
{{- $layout := printf "tp%d%s-seqs%d-len%d" (int $v.tensorParallelSize) (ternary "-sharded" "" $v.saveShardedCheckpoint) (int $v.maxNumSeqs) (int $v.maxModelLen) }}
{{- if eq .name "trn2" }}
{{- $layout = printf "tp%d-cp%d-vtp%d%s-seqs%d-len%d" (int $v.tensorParallelSize) (int $v.contextParallelSize) (int $v.visionTensorParallelSize) (ternary "-sharded" "" $v.saveShardedCheckpoint) (int $v.maxNumSeqs) (int $v.maxModelLen) }}
{{- end }}
layout: {{ $layout }}
{{- /* The generation's own Neuron release (CDK passes the support matrix's), else the chart default. */}}
{{- $release := default .root.Values.neuron.sdkVersion $v.neuronRelease }}
neuronRelease: {{ $release | quote }}
{{- /* The same key layout as gennstack/storage_layout.py compile_cache_prefix(). */}}
compilePrefix: {{ printf "neuron-%s/%s/%s/%s/" $release $v.modelId $v.revision $layout }}
{{- else }}
{{- /* vLLM's compile cache (torch.compile and Triton, restored into vllmCacheRoot): the same key layout as
gennstack/storage_layout.py vllm_compile_cache_prefix(); every g6e type has NVIDIA L40S GPUs. */}}
compilePrefix: {{ printf "vllm-%s/%s/%s/l40s-tp%d-seqs%d-len%d/" $v.vllmVersion $v.modelId $v.revision (int $v.gpusPerReplica) (int $v.maxNumSeqs) (int $v.maxModelLen) }}
{{- end }}
{{- end }}

{{/* Labels that select one generation's serving pods (or, with role, its spares and jobs). */}}
{{- define "gennstack-serving.selectorLabels" -}}
app.kubernetes.io/name: {{ .gen.pool }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{/* Required values, checked once for every template that reads them. */}}
{{- define "gennstack-serving.region" -}}
{{- required "aws.region is required: the region of the buckets, e.g. us-east-1" .Values.aws.region }}
{{- end }}
{{- define "gennstack-serving.modelsBucket" -}}
{{- required "buckets.models is required: the models bucket's name" .Values.buckets.models }}
{{- end }}
{{- define "gennstack-serving.compileCacheBucket" -}}
{{- required "buckets.compileCache is required: the compile-cache bucket's name (Neuron compiled models, g6e's vLLM compile cache)" .Values.buckets.compileCache }}
{{- end }}

{{/*
Pins a pod to a generation's nodes: node label, taint toleration. With onDemand, never spot: an
on-demand node or one of the generation's capacity reservations (Karpenter 1.14.1 labels those
`karpenter.sh/capacity-type: reserved`, pkg/apis/v1/labels.go CapacityTypeReserved).
*/}}
{{- define "gennstack-serving.placement" -}}
nodeSelector:
  gennstack.io/generation: {{ .gen.name }}
{{- if .onDemand }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: karpenter.sh/capacity-type
              operator: In
              values: ["on-demand", "reserved"]
{{- end }}
tolerations:
  - key: {{ .gen.taint }}
    operator: Equal
    value: "true"
    effect: NoSchedule
{{- end }}

{{/* Requests and limits of one replica: its accelerators plus CPU and memory. */}}
{{- define "gennstack-serving.resources" -}}
{{- $v := index .root.Values .gen.name -}}
{{- $cpu := "" }}{{- $memory := "" }}
{{- if .gen.neuron }}
{{- $cpu = $v.resources.cpu }}{{- $memory = $v.resources.memory }}
{{- else }}
{{- $cpu = mul (int $v.resourcesPerGpu.cpu) (int $v.gpusPerReplica) | toString }}
{{- $memory = printf "%dGi" (mul (int (trimSuffix "Gi" $v.resourcesPerGpu.memory)) (int $v.gpusPerReplica)) }}
{{- end }}
requests:
  cpu: {{ $cpu | quote }}
  memory: {{ $memory }}
  {{ .gen.resource }}: {{ .gen.count | quote }}
limits:
  memory: {{ $memory }}
  {{ .gen.resource }}: {{ .gen.count | quote }}
{{- end }}

{{/* AWS settings every container that talks to AWS gets (credentials come from Pod Identity). */}}
{{- define "gennstack-serving.awsEnv" -}}
- name: AWS_REGION
  value: {{ include "gennstack-serving.region" .root | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ include "gennstack-serving.region" .root | quote }}
{{- end }}

{{/* Where a node's model cache puts one model revision and its compiled artifacts. */}}
{{- define "gennstack-serving.modelDir" -}}
{{- printf "/cache/models/%s" (trimSuffix "/" .gen.modelPrefix) }}
{{- end }}
{{- define "gennstack-serving.compiledDir" -}}
{{- if .gen.neuron }}
{{- printf "/cache/compiled/%s" (trimSuffix "/" .gen.compilePrefix) }}
{{- else }}
{{- include "gennstack-serving.vllmCacheRoot" . }}
{{- end }}
{{- end }}

{{/*
g6e: vLLM's cache root (VLLM_CACHE_ROOT) in the pod's writable home (volume "home"): vLLM 0.29.0 keeps
its torch.compile artifacts under <root>/torch_compile_cache/<hash>/ (vllm/compilation/backends.py
VllmBackend, and torch_aot_compile/<hash>/ with AOT compile, on by default with torch >= 2.10:
vllm/envs.py use_aot_compile, vllm/compilation/decorators.py), the hash covering its config (the
model path included), its environment (envs.compile_factors, which leaves VLLM_CACHE_ROOT out) and
the traced code. The Triton cache (TRITON_CACHE_DIR) goes under it too, so one folder holds the set.
*/}}
{{- define "gennstack-serving.vllmCacheRoot" -}}/home/vllm/.cache/vllm{{- end }}

{{/*
The init container that fills the pod's cache from S3 with files/s3sync.py, run by the python3 and
boto3 of the generation's own image (credentials from Pod Identity): Neuron pods copy the weights
and compiled artifacts (the servers with saveShardedCheckpoint, trn2's and inf2's, load the presharded checkpoint from them, not
the model's safetensors); g6e pods (whose weights stream from S3) copy only the staged tiktoken
encodings and, once the compile Job has staged it, vLLM's compile cache (into their home). mode: serve (fail when anything is missing) or compile (skip a compile already in S3).
*/}}
{{- define "gennstack-serving.syncContainer" -}}
- name: sync-from-s3
  image: {{ .gen.image }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  command: ["python3", "/scripts/s3sync.py", "pull"]
  env:
    {{- include "gennstack-serving.awsEnv" . | nindent 4 }}
    - name: MODE
      value: {{ .mode }}
    - name: S3_CONCURRENCY
      value: {{ .root.Values.sync.concurrency | quote }}
    - name: MODELS_BUCKET
      value: {{ include "gennstack-serving.modelsBucket" .root | quote }}
    {{- if .gen.neuron }}
    - name: MODEL_PREFIX
      value: {{ .gen.modelPrefix | quote }}
    - name: MODEL_DIR
      value: {{ include "gennstack-serving.modelDir" . | quote }}
    {{- if and (eq .mode "serve") (index .root.Values .gen.name).saveShardedCheckpoint }}
    # The server reads its weights from the presharded checkpoint in the compiled artifacts: the
    # model's safetensors stay in S3 (gennstack/storage_layout.py PRESHARDED_SERVER_SKIPS).
    - name: MODEL_EXCLUDE
      value: "*.safetensors"
    {{- end }}
    {{- else }}
    - name: MARKER_PREFIX
      value: {{ .gen.modelPrefix | quote }}
    - name: MODEL_PREFIX
      value: {{ printf "%stiktoken/" .gen.modelPrefix | quote }}
    - name: MODEL_DIR
      value: /cache/tiktoken
    {{- end }}
    {{- if .gen.neuron }}
    # Log the node's Neuron driver and the image's runtime, and stop on a pair that fails at load
    # (files/neuron_compat.py).
    - name: NEURON_CHECK
      value: "true"
    {{- else if eq .mode "serve" }}
    # vLLM's compile cache is a head start, not a requirement: without one the server compiles
    # itself (a cold start), and the compile Job stages it for the pods after.
    - name: COMPILE_OPTIONAL
      value: "true"
    {{- end }}
    - name: COMPILE_BUCKET
      value: {{ include "gennstack-serving.compileCacheBucket" .root | quote }}
    - name: COMPILE_PREFIX
      value: {{ .gen.compilePrefix | quote }}
    - name: COMPILED_DIR
      value: {{ include "gennstack-serving.compiledDir" . | quote }}
  resources:
    requests:
      cpu: "4"
      memory: 4Gi
    limits:
      memory: 8Gi
  {{- /* Root for the Neuron node's hostPath cache (root's directory); else the vLLM image's user. */}}
  {{- include "gennstack-serving.containerSecurity" (dict "user" (include "gennstack-serving.serverUser" .)) | nindent 2 }}
  volumeMounts:
    - name: scripts
      mountPath: /scripts
      readOnly: true
    - name: cache
      mountPath: /cache
    - name: work
      mountPath: /work
    {{- if not .gen.neuron }}
    # The compile cache goes into the server's home (gennstack-serving.vllmCacheRoot), which vLLM writes.
    - name: home
      mountPath: /home/vllm
    {{- end }}
{{- end }}

{{/*
The vLLM server's arguments (after `vllm serve`), as a JSON list. Serving pods and compile Jobs
use the same list, so compiled artifacts always match what serving loads.
*/}}
{{- define "gennstack-serving.vllmArgs" -}}
{{- $v := index .root.Values .gen.name -}}
{{- $args := list "--served-model-name" $v.servedModelName "--max-model-len" (toString (int $v.maxModelLen)) "--max-num-seqs" (toString (int $v.maxNumSeqs)) -}}
{{- if .gen.neuron }}
{{- /* The KV block count spelled out, ceil(max_model_len / block_size) x max_num_seqs: vllm-neuron builds
NxD Inference's pa_num_blocks from it (and adds one null block), and without it vLLM would size the KV
cache from the NeuronWorker's determine_available_memory, the runtime's free bytes (or a 20 GB guess),
not the cache the compiled model holds (vllm-project/vllm-neuron main a5ef7c8, vllm_neuron/platform.py
and worker/neuronx_distributed_model_loader.py). With prefix caching off the plugin sets block_size to
max_model_len, so vLLM's scheduler sees more blocks than sequences; max_num_seqs is what limits a batch. */}}
{{- $blocks := mul (div (add (int $v.maxModelLen) 31) 32) (int $v.maxNumSeqs) }}
{{- $args = concat (list "--model" (include "gennstack-serving.modelDir" .)) $args (list "--tensor-parallel-size" (toString (int $v.tensorParallelSize)) "--block-size" "32" "--num-gpu-blocks-override" (toString $blocks) "--no-enable-prefix-caching") }}
{{- if eq .gen.name "trn2" }}
{{- /* Llama 4 loads through vllm-neuron's multimodal loader, which accepts only text_neuron_config and
vision_neuron_config here and lays each over the defaults built from the vLLM flags (tp_degree, batch_size, seq_len). */}}
{{- $tp := int $v.tensorParallelSize }}{{- $vtp := int $v.visionTensorParallelSize }}
{{- $text := dict "cp_degree" (int $v.contextParallelSize) "save_sharded_checkpoint" $v.saveShardedCheckpoint }}
{{- $vision := dict "tp_degree" $vtp "world_size" $tp "batch_size" 1 "buckets" (list 8 28 88) "save_sharded_checkpoint" $v.saveShardedCheckpoint }}
{{- $override := dict "override_neuron_config" (dict "text_neuron_config" $text "vision_neuron_config" $vision) }}
{{- $args = concat $args (list "--additional-config" (toJson $override)) }}
{{- else if $v.saveShardedCheckpoint }}
{{- /* Llama 3 loads through vllm-neuron's NeuronCausalLM (vllm-project/vllm-neuron a5ef7c8
get_neuron_model): the override is laid over its default neuron config, and NxD Inference 2.28.0
(cd3abf3 models/application_base.py) compile() then shards the checkpoint into
<compiled>/weights/tp<rank>_sharded_checkpoint.safetensors, which load_weights reads instead of the
model's safetensors. */}}
{{- $args = concat $args (list "--additional-config" (toJson (dict "override_neuron_config" (dict "save_sharded_checkpoint" true)))) }}
{{- end }}
{{- else }}
{{- $s3 := printf "s3://%s/%s" (include "gennstack-serving.modelsBucket" .root) .gen.modelPrefix }}
{{- $args = concat (list "--model" $s3 "--load-format" "runai_streamer") $args (list "--tensor-parallel-size" (toString (int $v.gpusPerReplica)) "--gpu-memory-utilization" (toString $v.gpuMemoryUtilization)) }}
{{- /* vLLM 0.29.0 drains in-flight requests on SIGTERM for up to --shutdown-timeout seconds. */}}
{{- $args = concat $args (list "--shutdown-timeout" (include "gennstack-serving.shutdownTimeoutSeconds" .)) }}
{{- if $v.toolCallParser }}
{{- $args = concat $args (list "--tool-call-parser" $v.toolCallParser "--enable-auto-tool-choice") }}
{{- end }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/* Environment of a model server container. */}}
{{- define "gennstack-serving.serverEnv" -}}
{{- include "gennstack-serving.awsEnv" . }}
# Nothing from the internet on the serving path.
- name: HF_HUB_OFFLINE
  value: "1"
{{- if and (not .gen.neuron) (index .root.Values .gen.name).tiktokenEncodings }}
# openai_harmony reads its encodings from here (copied by sync-from-s3) instead of downloading them.
- name: TIKTOKEN_ENCODINGS_BASE
  value: /cache/tiktoken
{{- end }}
- name: VLLM_ARGS
  value: {{ include "gennstack-serving.vllmArgs" . | quote }}
{{- if not .gen.neuron }}
# Where vLLM and Triton keep what they compile: the folder sync-from-s3 restores from the compile
# cache and the compile Job uploads (gennstack-serving.vllmCacheRoot). vLLM 0.29.0 vllm/envs.py reads
# VLLM_CACHE_ROOT; Triton reads TRITON_CACHE_DIR (vLLM's InductorAdaptor points it at a triton_cache
# folder under the same root itself, vllm/compilation/compiler_interface.py initialize_cache).
- name: VLLM_CACHE_ROOT
  value: {{ include "gennstack-serving.vllmCacheRoot" . | quote }}
- name: TRITON_CACHE_DIR
  value: {{ printf "%s/triton" (include "gennstack-serving.vllmCacheRoot" .) | quote }}
{{- end }}
{{- if .gen.neuron }}
- name: NEURON_COMPILED_ARTIFACTS
  value: {{ include "gennstack-serving.compiledDir" . | quote }}
{{- end }}
{{- end }}

{{/* The native sidecar that drops karpenter.sh/do-not-disrupt once the server is healthy. */}}
{{- define "gennstack-serving.releaseSidecar" -}}
{{- if .root.Values.loading.releaseDoNotDisruptWhenReady }}
- name: release-do-not-disrupt
  image: {{ .gen.image }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  restartPolicy: Always
  command: ["python3", "/scripts/release_do_not_disrupt.py"]
  env:
    - name: HEALTH_URL
      value: {{ .healthUrl | quote }}
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
  resources:
    requests:
      cpu: 10m
      memory: 64Mi
    limits:
      memory: 128Mi
  {{- include "gennstack-serving.containerSecurity" (dict "user" "helper") | nindent 2 }}
  volumeMounts:
    - name: scripts
      mountPath: /scripts
      readOnly: true
{{- end }}
{{- end }}

{{/*
Pod security (docs/security.md, "Pod security"). Every pod of the chart gets the container
runtime's default seccomp profile (gennstack-serving.podSecurity); every container no
capabilities and no privilege escalation (gennstack-serving.containerSecurity). A container runs
as a user other than root wherever its image and volumes allow:
- the vLLM image (images.vllm, v0.29.0): its `vllm` user, UID 2000 GID 0, whose home and Python
  install are group-0 writable/readable (vllm-project/vllm PR #40275, docker/Dockerfile
  "Create a conventional `vllm` user (UID 2000, GID 0)"; the image keeps `USER root` by default);
- helpers that only run the chart's scripts (user "helper"): 65532, which needs no passwd entry
  (the scripts read HOME nowhere), with a read-only root filesystem;
- the Neuron DLC's servers, compile and cache sync stay root (the DLC has no USER; the node's
  hostPath cache is root's 0755 directory, kubelet's DirectoryOrCreate; non-root access to
  /dev/neuron* depends on the node's udev rule, which the Neuron docs suggest restricting to a
  group: aws-neuron-sdk about-neuron/security.rst), without any capability.
Call with (dict "user" "vllm"|"helper"|"root").
*/}}
{{- define "gennstack-serving.podSecurity" -}}
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end }}
{{- define "gennstack-serving.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
  {{- if eq .user "vllm" }}
  runAsNonRoot: true
  runAsUser: 2000
  runAsGroup: 0
  {{- else if eq .user "helper" }}
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  {{- else if ne .user "root" }}
  {{- fail (printf "containerSecurity: user %q; allowed: vllm, helper, root" .user) }}
  {{- end }}
{{- end }}
{{/* The user of a generation's model-server containers: the vLLM image's own, or root (Neuron DLC). */}}
{{- define "gennstack-serving.serverUser" -}}
{{- ternary "root" "vllm" (eq (toString .gen.neuron) "true") }}
{{- end }}
{{/*
What a container of the vLLM image running as its `vllm` user needs: HOME (where HF, vLLM, Triton,
torch inductor and FlashInfer keep their caches; an emptyDir, volume "home") and USER, which
getpass.getuser() (torch's cache directories) reads before the passwd entry.
*/}}
{{- define "gennstack-serving.vllmUserEnv" -}}
- name: HOME
  value: /home/vllm
- name: USER
  value: vllm
{{- end }}

{{/*
A warm spare's preferred anti-affinity to its generation's serving pods (role server), by zone:
Karpenter v1.14.1 tries preferred terms as if required before it relaxes them
(pkg/controllers/provisioning/scheduling/preferences.go), so a spare's node goes to a zone with no
replica, else anywhere: out of the zone one correlated reclaim takes. Not by instance type: on g6e
that term sent spares, and the serving pods that preempt them, to pricier sizes (gennstack simulate,
docs/spot-drills.md). gennstack/serving/spare_placement.py holds the rule and its weight
(tests/serving/test_spare_placement.py keeps the two equal).
*/}}
{{- define "gennstack-serving.spareAntiAffinity" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      {{- include "gennstack-serving.spareAntiAffinityTerms" (dict "gen" .gen) | nindent 6 }}
{{- end }}

{{/*
The terms alone: (dict "gen" $gen "namespaces" (list ...)); namespaces, the serving pods', for spares
in another namespace (the multi-node spare groups, templates/multinode-warm-spare.yaml); omitted: the
spare's own.
*/}}
{{- define "gennstack-serving.spareAntiAffinityTerms" -}}
{{- $root := . }}
{{- range $key := list "topology.kubernetes.io/zone" }}
- weight: 100
  podAffinityTerm:
    topologyKey: {{ $key }}
    {{- with $root.namespaces }}
    namespaces: {{ toJson . }}
    {{- end }}
    labelSelector:
      matchLabels:
        {{- include "gennstack-serving.selectorLabels" (dict "gen" $root.gen "role" "server") | nindent 8 }}
{{- end }}
{{- end }}

{{/* Spread a generation's pods over zones (and nodes). */}}
{{- define "gennstack-serving.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: {{ .root.Values.spot.zoneSpread }}
    labelSelector:
      matchLabels:
        {{- include "gennstack-serving.selectorLabels" . | nindent 8 }}
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "gennstack-serving.selectorLabels" . | nindent 8 }}
{{- end }}

{{/* Volumes of a pod that uses the node's model cache and the chart's scripts. */}}
{{- define "gennstack-serving.volumes" -}}
- name: scripts
  configMap:
    name: gennstack-serving-scripts
- name: work
  emptyDir: {}
- name: home
  emptyDir: {}
{{- /* The node's cache outlives the pod: only the servers' and warm spares' sync-from-s3 fills it
(the servers mount it read-only). A compile Job, which runs the model's code, copies into a cache
of its own that goes with its pod: an emptyDir under /var/lib/kubelet, on the same disk as the
hostPath (inf2: the root volume; trn2: the NVMe RAID0, onto which the AMI bind-mounts
/var/lib/kubelet, awslabs/amazon-eks-ami v20260714 templates/al2023/runtime/bin/setup-local-disks). */}}
{{- if and .gen.neuron (ne .role "compile") }}
- name: cache
  hostPath:
    path: {{ (index .root.Values .gen.name).hostCachePath }}
    type: DirectoryOrCreate
{{- else }}
- name: cache
  emptyDir: {}
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: 16Gi
{{- end }}

{{/* preStop: keep serving while endpoints drop the pod, then SIGTERM (see preStopSeconds). */}}
{{- define "gennstack-serving.lifecycle" -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ include "gennstack-serving.preStopSeconds" . }}
{{- end }}

{{- define "gennstack-serving.probes" -}}
startupProbe:
  httpGet:
    path: {{ .path }}
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: {{ div (int .timeout) 10 }}
  # vLLM answers /health from its API server's event loop, which a full batch can hold for more
  # than the 1 s default: a slow answer is not a dead server.
  timeoutSeconds: 5
readinessProbe:
  httpGet:
    path: {{ .path }}
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: {{ .path }}
    port: {{ .port }}
  periodSeconds: 15
  timeoutSeconds: 5
  failureThreshold: 4
{{- end }}

{{/*
Seconds from the end of a server's drain to SIGKILL, for the process to exit and free its
accelerators.
*/}}
{{- define "gennstack-serving.exitMarginSeconds" -}}10{{- end }}

{{/*
Whether a generation's server drains in-flight requests after SIGTERM: vLLM 0.29.0 (g6e) does, for
--shutdown-timeout seconds; the Neuron 2.28.0 DLC's vLLM 0.13.0 (trn2, and inf2's vLLM under Ray) has no
such flag and aborts them on SIGTERM.
*/}}
{{- define "gennstack-serving.drainsOnSigterm" -}}{{ eq .gen.name "g6e" }}{{- end }}

{{/*
preStop sleep of a server. One that drains on SIGTERM sleeps spot.preStopSleepSeconds (endpoints
drop it, no new request arrives) and then drains. One that cannot drain keeps serving its in-flight
requests through the sleep itself: the whole grace period less the exit margin.
*/}}
{{- define "gennstack-serving.preStopSeconds" -}}
{{- $grace := int .root.Values.spot.terminationGracePeriodSeconds }}
{{- $margin := int (include "gennstack-serving.exitMarginSeconds" .) }}
{{- if eq (include "gennstack-serving.drainsOnSigterm" .) "true" }}
{{- .root.Values.spot.preStopSleepSeconds }}
{{- else }}
{{- max 0 (sub $grace $margin) }}
{{- end }}
{{- end }}

{{/* vLLM's --shutdown-timeout: what is left of the grace period after preStop and the exit margin. */}}
{{- define "gennstack-serving.shutdownTimeoutSeconds" -}}
{{- $grace := int .root.Values.spot.terminationGracePeriodSeconds }}
{{- $preStop := int .root.Values.spot.preStopSleepSeconds }}
{{- $margin := int (include "gennstack-serving.exitMarginSeconds" .) }}
{{- $drain := sub (sub $grace $preStop) $margin }}
{{- if lt $drain 1 }}
{{- fail (printf "spot.terminationGracePeriodSeconds: got %d; allowed: at least spot.preStopSleepSeconds (%d) + %d + 1, so vLLM drains for at least 1 s (--shutdown-timeout)" $grace $preStop $margin) }}
{{- end }}
{{- $drain }}
{{- end }}

{{/*
sha256 of the chart scripts one workload runs (call with (dict "root" $ "files" (list ...))), for a
checksum/scripts annotation: changing one script restarts only the pods that run it.
*/}}
{{- define "gennstack-serving.scriptsChecksum" -}}
{{- $text := "" }}
{{- range $file := .files }}
{{- $content := $.root.Files.Get (printf "files/%s" $file) }}
{{- if not $content }}{{ fail (printf "scriptsChecksum: files/%s is not in the chart" $file) }}{{ end }}
{{- $text = printf "%s\n--- %s\n%s" $text $file $content }}
{{- end }}
{{- sha256sum $text }}
{{- end }}

{{/*
The scripts a generation's serving pod runs: the vLLM launcher, the S3 sync (s3sync.py; on Neuron
also its driver/runtime check, neuron_compat.py) and the do-not-disrupt release sidecar (when
enabled); gen1-inf2 also the Ray Serve application and the preStop's Ray drain.
*/}}
{{- define "gennstack-serving.serverScripts" -}}
{{- $files := list "vllm_serve.py" }}
{{- if eq .gen.name "inf2" }}{{ $files = concat $files (list "gennstack_serve.py" "ray_drain.py") }}{{ end }}
{{- $files = append $files "s3sync.py" }}
{{- if .gen.neuron }}{{ $files = append $files "neuron_compat.py" }}{{ end }}
{{- if .root.Values.loading.releaseDoNotDisruptWhenReady }}{{ $files = append $files "release_do_not_disrupt.py" }}{{ end }}
{{- toJson $files }}
{{- end }}

{{/*
Pins a pod to on-demand nodes of the general CPU pool: for what must not be reclaimed with spot
(gen1-inf2's Ray head and its GCS Redis). The system node group's m7i/m6i/m7a.large nodes (2 vCPU,
8 GiB) cannot hold the head's 2 CPU / 8 GiB besides the system pods.
*/}}
{{- define "gennstack-serving.onDemandGeneral" -}}
nodeSelector:
  gennstack.io/pool: general
  karpenter.sh/capacity-type: on-demand
{{- end }}

{{/* Whole CPUs of a Kubernetes CPU quantity ("160", "1.5", "500m"), at least 1. */}}
{{- define "gennstack-serving.wholeCpus" -}}
{{- if hasSuffix "m" . }}
{{- max 1 (div (int (trimSuffix "m" .)) 1000) }}
{{- else }}
{{- max 1 (int (floor (float64 .))) }}
{{- end }}
{{- end }}

{{/*
The preStop's Ray drain, run with the Python of the Ray on PATH (the `ray` entry point's directory):
/opt/ray/bin/python3 in the image CDK builds (assets/images/inf2-ray-serve), the image's own Python
where Ray is installed beside everything else.
*/}}
{{- define "gennstack-serving.rayPython" -}}
exec "$(dirname "$(readlink -f "$(command -v ray)")")/python3" /scripts/ray_drain.py
{{- end }}
