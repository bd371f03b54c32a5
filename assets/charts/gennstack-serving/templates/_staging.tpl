{{/*
The staging and compile Jobs' pod templates, names and the compile Job's suspend gate.

A Job's pod template is immutable once the Job exists (batch/v1), so a chart change that touched
the template of a live Job would fail `helm upgrade`. Each name therefore carries a hash of the S3
keys the Job produces AND of its rendered pod template: a changed template makes a new Job (which
skips the work already complete in S3) and helm deletes the old one, instead of failing the upgrade.
*/}}

{{/* The stage Job's pod template. Call with (dict "root" $ "gen" $gen "compileJob" <name or "">). */}}
{{- define "gennstack-serving.stagePodTemplate" -}}
{{- $root := .root }}{{- $gen := .gen }}
{{- $v := index $root.Values $gen.name }}
{{- $ctx := dict "root" $root "gen" $gen "role" "staging" }}
metadata:
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
    {{- include "gennstack-serving.selectorLabels" $ctx | nindent 4 }}
spec:
  restartPolicy: Never
  serviceAccountName: {{ $root.Values.serviceAccounts.staging.name }}
  # stage.py records the model in its staged marker (and releases the compile Job) through the
  # Kubernetes API with this account's token.
  automountServiceAccountToken: true
  {{- include "gennstack-serving.podSecurity" $ctx | nindent 2 }}
  containers:
    - name: stage
      # Has python3, huggingface_hub and boto3.
      image: {{ $root.Values.images.vllm }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["python3", "/scripts/stage.py"]
      env:
        {{- include "gennstack-serving.awsEnv" $ctx | nindent 8 }}
        - name: MODELS_BUCKET
          value: {{ include "gennstack-serving.modelsBucket" $root | quote }}
        - name: MODEL_PREFIX
          value: {{ $gen.modelPrefix | quote }}
        - name: MODEL_ID
          value: {{ $v.modelId | quote }}
        - name: MODEL_REVISION
          value: {{ $v.revision | quote }}
        # The secret's name or ARN; stage.py reads the token itself.
        - name: HF_TOKEN_SECRET
          value: {{ $root.Values.staging.hfTokenSecret | quote }}
        - name: HF_HOME
          value: /scratch
        {{- if and (not $gen.neuron) $v.tiktokenEncodings }}
        - name: TIKTOKEN_ENCODINGS
          value: {{ join " " $v.tiktokenEncodings | quote }}
        {{- end }}
        # Where stage.py records the staged model (Role gennstack-serving-staged-markers).
        - name: STAGED_CONFIGMAP
          value: {{ include "gennstack-serving.stagedConfigMap" $gen | quote }}
        # What the gate closes, which stage.py opens once the marker is complete (Role gennstack-serving-open-staged-gates).
        - name: STAGED_GATE
          value: {{ include "gennstack-serving.stagedGateFile" $gen | quote }}
        {{- if .compileJob }}
        # Un-suspended by stage.py once the model is staged (the Role allows patching only it).
        - name: COMPILE_JOB
          value: {{ .compileJob | quote }}
        {{- end }}
      resources:
        {{- toYaml $root.Values.staging.resources | nindent 8 }}
      {{- /* python3, huggingface_hub and boto3 of the vLLM image, as its own user: writes only /scratch and /tmp. */}}
      {{- include "gennstack-serving.containerSecurity" (dict "user" "vllm") | nindent 6 }}
        readOnlyRootFilesystem: true
      volumeMounts:
        - name: scripts
          mountPath: /scripts
          readOnly: true
        - name: scratch
          mountPath: /scratch
        - name: tmp
          mountPath: /tmp
        - name: gates
          mountPath: /gates
          readOnly: true
  volumes:
    - name: scripts
      configMap:
        name: gennstack-serving-scripts
    - name: scratch
      emptyDir: {}
    - name: tmp
      emptyDir: {}
    {{- include "gennstack-serving.stagedGatesVolume" . | nindent 4 }}
{{- end }}

{{/* The compile Job's pod template. Call with (dict "root" $ "gen" $gen). */}}
{{- define "gennstack-serving.compilePodTemplate" -}}
{{- $root := .root }}{{- $gen := .gen }}
{{- $compile := dict "root" $root "gen" $gen "role" "compile" }}
metadata:
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
    {{- include "gennstack-serving.selectorLabels" $compile | nindent 4 }}
  annotations:
    # A compile takes up to an hour: never consolidate its node away.
    karpenter.sh/do-not-disrupt: "true"
    {{- if $gen.neuron }}
    # The compile container runs the model's code: EKS Pod Identity's webhook gives a skipped
    # container neither its token volume nor AWS_CONTAINER_* (aws/amazon-eks-pod-identity-webhook
    # pkg/handler/handler.go getContainersToSkip, in both its IRSA and container-credentials modes).
    # A second line: the account's role can write only this generation's compile-cache prefix.
    eks.amazonaws.com/skip-containers: compile
    {{- end }}
    {{- /* g6e's compile container keeps the credentials: like its servers it streams the weights
    from S3 (--load-format runai_streamer; the model path vLLM hashes into the cache key must be the
    same s3:// URL the servers load). Its role reads only its model and writes only its compile-cache
    prefix (gennstack_infra/components/serving.py). */}}
spec:
  restartPolicy: Never
  # One account per Neuron generation (gennstack-serving.compileServiceAccount): its role reads this
  # generation's model and writes only its compile-cache prefix; it cannot read the Hugging Face
  # token or write the models bucket (gennstack_infra/components/serving.py).
  serviceAccountName: {{ include "gennstack-serving.compileServiceAccount" $compile }}
  # No Kubernetes token in every container: only the upload, which records the compiled artifacts in
  # the staged marker, mounts one (volume kube-api-token).
  automountServiceAccountToken: false
  priorityClassName: {{ $root.Values.priorityClasses.serving.name }}
  {{- include "gennstack-serving.podSecurity" $compile | nindent 2 }}
  # Neuron: never spot (on-demand or reserved): a spot reclaim mid-compile must not leave a half-written artifact
  # set serving needs. g6e: any capacity, spot first (its set is a cache the servers do without, uploaded with its
  # marker last; a reclaim fails the Job and the servers compile at start), so a spot-only gen3-g6e
  # (on_demand_fallback false) does not leave it Pending.
  {{- include "gennstack-serving.placement" (dict "gen" $gen "onDemand" $gen.neuron) | nindent 2 }}
  initContainers:
    {{- include "gennstack-serving.syncContainer" (dict "root" $root "gen" $gen "mode" "compile") | nindent 4 }}
    - name: compile
      image: {{ $gen.image }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["/bin/bash", "/scripts/compile.sh"]
      env:
        {{- include "gennstack-serving.serverEnv" $compile | nindent 8 }}
        {{- if not $gen.neuron }}
        {{- include "gennstack-serving.vllmUserEnv" $compile | nindent 8 }}
        {{- end }}
      resources:
        {{- include "gennstack-serving.resources" $compile | nindent 8 }}
      {{- include "gennstack-serving.containerSecurity" (dict "user" (include "gennstack-serving.serverUser" $compile)) | nindent 6 }}
      volumeMounts:
        - name: scripts
          mountPath: /scripts
          readOnly: true
        - name: cache
          mountPath: /cache
        - name: work
          mountPath: /work
        - name: dshm
          mountPath: /dev/shm
        {{- if not $gen.neuron }}
        - name: home
          mountPath: /home/vllm
        {{- end }}
  containers:
    - name: upload
      image: {{ $gen.image }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["python3", "/scripts/s3sync.py", "push"]
      env:
        {{- include "gennstack-serving.awsEnv" $compile | nindent 8 }}
        - name: S3_CONCURRENCY
          value: {{ $root.Values.sync.concurrency | quote }}
        - name: COMPILE_BUCKET
          value: {{ include "gennstack-serving.compileCacheBucket" $root | quote }}
        - name: COMPILE_PREFIX
          value: {{ $gen.compilePrefix | quote }}
        - name: COMPILED_DIR
          value: {{ include "gennstack-serving.compiledDir" $compile | quote }}
        # Where the upload records the compiled artifacts (Role <pool>-compile-marker, templates/staging.yaml).
        - name: STAGED_CONFIGMAP
          value: {{ include "gennstack-serving.stagedConfigMap" $gen | quote }}
        # What the gate closes, which the upload opens once the marker is complete (Role <pool>-compile-open-gate).
        - name: STAGED_GATE
          value: {{ include "gennstack-serving.stagedGateFile" $gen | quote }}
      resources:
        requests:
          cpu: "4"
          memory: 4Gi
        limits:
          memory: 8Gi
      {{- include "gennstack-serving.containerSecurity" (dict "user" "helper") | nindent 6 }}
      volumeMounts:
        - name: scripts
          mountPath: /scripts
          readOnly: true
        - name: cache
          mountPath: /cache
          readOnly: true
        - name: work
          mountPath: /work
          readOnly: true
        - name: kube-api-token
          mountPath: /var/run/secrets/kubernetes.io/serviceaccount
          readOnly: true
        - name: gates
          mountPath: /gates
          readOnly: true
        {{- if not $gen.neuron }}
        # What the compile filled: vLLM's cache root (gennstack-serving.compiledDir).
        - name: home
          mountPath: /home/vllm
          readOnly: true
        {{- end }}
  volumes:
    {{- include "gennstack-serving.volumes" $compile | nindent 4 }}
    # What the ServiceAccount admission plugin would mount in every container (a bound token, the
    # cluster's CA, the namespace: kubernetes plugin/pkg/admission/serviceaccount), for the upload only.
    - name: kube-api-token
      projected:
        sources:
          - serviceAccountToken:
              path: token
              expirationSeconds: 3607
          - configMap:
              name: kube-root-ca.crt
              items:
                - key: ca.crt
                  path: ca.crt
          - downwardAPI:
              items:
                - path: namespace
                  fieldRef:
                    fieldPath: metadata.namespace
    {{- include "gennstack-serving.stagedGatesVolume" . | nindent 4 }}
{{- end }}

{{/* The compile Jobs' ServiceAccount of a generation: `<serviceAccounts.compile.name>-<gen>`. */}}
{{- define "gennstack-serving.compileServiceAccount" -}}
{{- printf "%s-%s" .root.Values.serviceAccounts.compile.name .gen.name }}
{{- end }}

{{/* The gates ConfigMap (gennstack-serving.stagedGates) as a volume: a key the chart did not render
(a forced gate) is no file, which the Jobs read as "nothing to open". */}}
{{- define "gennstack-serving.stagedGatesVolume" -}}
- name: gates
  configMap:
    name: gennstack-serving-staged-gates
{{- end }}

{{/* `<pool>-compile-<hash>` of a generation. Call with (dict "root" $ "gen" $gen). */}}
{{- define "gennstack-serving.compileJobName" -}}
{{- $template := include "gennstack-serving.compilePodTemplate" . }}
{{- printf "%s-compile-%s" .gen.pool (printf "%s\n%s" .gen.compilePrefix $template | sha256sum | trunc 10) }}
{{- end }}

{{/* `<pool>-stage-<hash>`. Call with (dict "root" $ "gen" $gen "compileJob" <name or "">). */}}
{{- define "gennstack-serving.stageJobName" -}}
{{- $template := include "gennstack-serving.stagePodTemplate" . }}
{{- printf "%s-stage-%s" .gen.pool (printf "%s\n%s" .gen.modelPrefix $template | sha256sum | trunc 10) }}
{{- end }}

{{/*
The compile Job's spec.suspend: "true" unless its model is known to be staged, so that it creates
no pod (and Karpenter launches no on-demand accelerator node) while staging runs; stage.py sets it
to false once the model is in S3. Known to be staged, from the live cluster (helm's `lookup`; it
returns nothing under `helm template` and `helm lint`, which therefore render "true"):
- the live compile Job is already released (spec.suspend false): keep it so. Rendering true again
  would make `helm upgrade` suspend a running compile (the Job controller deletes its pods) or, with
  server-side apply, fail on a conflict with stage.py's field manager;
- the live stage Job has succeeded: it wrote the marker and released the compile Job, so a
  suspend that came back (an upgrade that rendered before that release and applied after it) is undone.
Call with (dict "root" $ "compileJob" <name> "stageJob" <name>).
*/}}
{{- define "gennstack-serving.compileSuspend" -}}
{{- $ns := .root.Release.Namespace }}
{{- $compile := lookup "batch/v1" "Job" $ns .compileJob }}
{{- $stage := lookup "batch/v1" "Job" $ns .stageJob }}
{{- $released := and (not (empty $compile)) (not (dig "spec" "suspend" false $compile)) }}
{{- $staged := gt (int (dig "status" "succeeded" 0 $stage)) 0 }}
{{- ternary "false" "true" (or $released $staged) }}
{{- end }}

{{/*
The staged marker: the ConfigMap `<pool>-staged` (templates/staged-markers.yaml) whose keys the
stage Job (`model-<h>`, weights complete in S3) and the compile Job's upload (`compiled-<h>`,
compiled artifacts complete) add, each with its S3 prefix as the value; `<h>` is the first 16 hex
digits of the prefix's sha256, as files/kube_patch.py staged_key computes it.
*/}}
{{- define "gennstack-serving.stagedConfigMap" -}}
{{- printf "%s-staged" .pool }}
{{- end }}
{{- define "gennstack-serving.stagedKey" -}}
{{- printf "%s-%s" .kind (sha256sum .prefix | trunc 16) }}
{{- end }}

{{/*
"true" when a generation's servers and warm spares may request accelerator nodes: its marker holds
the model prefix this release renders and, for Neuron, its compile-cache prefix (which carries the
Neuron release and layout). `<gen>.staged: auto` reads the live marker with helm's `lookup` at
install and upgrade; `helm template` and `helm lint` have no cluster (lookup returns an empty map),
so there auto renders the gate closed. `true` or `false` force it. Call with (dict "root" $ "gen" $gen).
*/}}
{{- define "gennstack-serving.staged" -}}
{{- $mode := toString (index .root.Values .gen.name).staged }}
{{- if eq $mode "auto" }}
{{- $marker := lookup "v1" "ConfigMap" .root.Release.Namespace (include "gennstack-serving.stagedConfigMap" .gen) }}
{{- $data := dig "data" (dict) $marker }}
{{- $open := eq (toString (get $data (include "gennstack-serving.stagedKey" (dict "kind" "model" "prefix" .gen.modelPrefix)))) .gen.modelPrefix }}
{{- if .gen.neuron }}
{{- $open = and $open (eq (toString (get $data (include "gennstack-serving.stagedKey" (dict "kind" "compiled" "prefix" .gen.compilePrefix)))) .gen.compilePrefix) }}
{{- end }}
{{- ternary "true" "false" $open }}
{{- else }}
{{- $mode }}
{{- end }}
{{- end }}

{{/*
What a closed gate puts in a server's or warm spare's pod spec: a scheduling gate, so the pod is
created but never scheduled, and Karpenter (which provisions only for pods the scheduler marked
Unschedulable) starts no node for it. Renders nothing when the gate is open. Call with (dict "root" $ "gen" $gen).
*/}}
{{- define "gennstack-serving.schedulingGates" -}}
{{- if ne (include "gennstack-serving.staged" .) "true" }}
# Closed until the generation is staged (ConfigMap {{ include "gennstack-serving.stagedConfigMap" .gen }}); the Job that completes it opens the gate.
schedulingGates:
  - name: gennstack.io/staged
{{- end }}
{{- end }}

{{/*
The label a closed gate puts on a generation's pods (servers, warm spares, gen1's Ray head):
`gennstack.io/staged: "false"`. kube-state-metrics exports it (kube_pod_labels, its allowlist in
gennstack/observability/values.py), so GenNStackNoReadyReplica stays quiet for a generation that
is waiting to be staged. Renders nothing when the gate is open. Call with (dict "root" $ "gen" $gen).
*/}}
{{- define "gennstack-serving.stagedLabel" -}}
{{- if ne (include "gennstack-serving.staged" .) "true" }}
gennstack.io/staged: "false"
{{- end }}
{{- end }}

{{/*
What each `auto` gate closes, for the Jobs that record its marker to open it once it is complete
(files/kube_patch.py open_gate; templates/staged-gates.yaml renders it as the ConfigMap
gennstack-serving-staged-gates, one `<pool>.json` each, and the Role on exactly these objects).
A deploy alone cannot be relied on to open it: CloudFormation runs the chart's `helm upgrade` only
when the HelmChart resource's properties change (aws-cdk-lib 2.275.0 aws-eks-v2/lib/helm-chart.js).
A forced gate (`true` / `false`) has no entry: only a deploy changes it. YAML: pool -> {pool, marker,
requires (marker key -> prefix), targets [{kind, namespace, name, ...}]}. Call with the root context.
*/}}
{{- define "gennstack-serving.stagedGates" -}}
{{- $gates := dict }}
{{- $ns := .Release.Namespace }}
{{- range $name := list "inf2" "trn2" "g6e" }}
{{- $v := index $.Values $name }}
{{- if and $v.enabled (eq (toString $v.staged) "auto") }}
{{- $gen := fromYaml (include "gennstack-serving.gen" (dict "root" $ "name" $name)) }}
{{- $requires := dict (include "gennstack-serving.stagedKey" (dict "kind" "model" "prefix" $gen.modelPrefix)) $gen.modelPrefix }}
{{- if $gen.neuron }}
{{- $_ := set $requires (include "gennstack-serving.stagedKey" (dict "kind" "compiled" "prefix" $gen.compilePrefix)) $gen.compilePrefix }}
{{- end }}
{{- $targets := list }}
{{- if eq $name "inf2" }}
{{- $targets = append $targets (dict "kind" "RayService" "namespace" $ns "name" $gen.pool "group" "inf2" "replicas" (int $v.minReplicas) "minReplicas" (int $v.minReplicas) "maxReplicas" (int $v.maxReplicas)) }}
{{- else }}
{{- $targets = append $targets (dict "kind" "Deployment" "namespace" $ns "name" $gen.pool) }}
{{- end }}
{{- $targets = append $targets (dict "kind" "Deployment" "namespace" $ns "name" (printf "%s-warm-spare" $gen.pool)) }}
{{- $_ := set $gates $gen.pool (dict "pool" $gen.pool "marker" (include "gennstack-serving.stagedConfigMap" $gen) "requires" $requires "targets" $targets) }}
{{- end }}
{{- end }}
{{- $m := .Values.multiNode }}
{{- if and $m.enabled (eq (toString $m.staged) "auto") }}
{{- $gen := fromYaml (include "gennstack-serving.multiNodeGen" $) }}
{{- $spares := default (printf "%s-group-spares" $ns) $m.warmSpareNamespace }}
{{- $targets := list (dict "kind" "LeaderWorkerSet" "namespace" $ns "name" $gen.pool) (dict "kind" "LeaderWorkerSet" "namespace" $spares "name" (printf "%s-warm-spare" $gen.pool)) }}
{{- $requires := dict (include "gennstack-serving.stagedKey" (dict "kind" "model" "prefix" $gen.modelPrefix)) $gen.modelPrefix }}
{{- $_ := set $gates $gen.pool (dict "pool" $gen.pool "marker" (include "gennstack-serving.stagedConfigMap" $gen) "requires" $requires "targets" $targets) }}
{{- end }}
{{- toYaml $gates }}
{{- end }}

{{/* The staged gate's file for a Job that records into `gen`'s marker (env STAGED_GATE). Call with $gen. */}}
{{- define "gennstack-serving.stagedGateFile" -}}
{{- printf "/gates/%s.json" .pool }}
{{- end }}

{{/* "true" while Jobs may record markers and open gates: staging on, or a compile Job kept
running with staging off (gennstack-serving.keptCompileJobs). Call with the root context. */}}
{{- define "gennstack-serving.recording" -}}
{{- ternary "true" "false" (or (.Values.staging.enabled | default false) (gt (len (fromJsonArray (include "gennstack-serving.keptCompileJobs" .))) 0)) }}
{{- end }}

{{/* A generation's compile Job (Neuron: its compiled model; g6e: vLLM's compile cache). Call with (dict "root" $ "gen" $gen "compileJob" <name> "stageJob" <name>). */}}
{{- define "gennstack-serving.compileJob" -}}
{{- $root := .root }}{{- $gen := .gen }}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .compileJob }}
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
    {{- include "gennstack-serving.selectorLabels" (dict "gen" $gen "role" "compile") | nindent 4 }}
  annotations:
    gennstack.io/s3-prefix: {{ printf "s3://%s/%s" (include "gennstack-serving.compileCacheBucket" $root) $gen.compilePrefix | quote }}
    gennstack.io/released-by: {{ .stageJob }}
spec:
  # No pod (and no on-demand accelerator node) until the stage Job has the model in S3.
  suspend: {{ include "gennstack-serving.compileSuspend" (dict "root" $root "compileJob" .compileJob "stageJob" .stageJob) }}
  # A failed compile is not retried into the shared cache: look at it, then re-run.
  backoffLimit: 0
  # Counted from the release: suspending resets the Job's startTime (batch/v1 JobSpec.suspend).
  activeDeadlineSeconds: {{ $root.Values.staging.compileActiveDeadlineSeconds }}
  ttlSecondsAfterFinished: {{ $root.Values.staging.ttlSecondsAfterFinished }}
  template:
    {{- include "gennstack-serving.compilePodTemplate" (dict "root" $root "gen" $gen) | nindent 4 }}
{{- end }}

{{/* What a Neuron generation's compile upload may do in the API, bound to that generation's compile
account (gennstack-serving.compileServiceAccount): record its artifacts in its own generation's
marker and, with its gate `auto`, open that gate (the objects its /gates file names, the rules of
gennstack-serving.openGateRules), nothing of another generation. Rendered with its compile Job
(staging on, or a compile Job kept running). Call with (dict "root" $ "gen" $gen). */}}
{{- define "gennstack-serving.compileRbac" -}}
{{- $root := .root }}{{- $gen := .gen }}
{{- $account := include "gennstack-serving.compileServiceAccount" (dict "root" $root "gen" $gen) }}
{{- $gate := get (fromYaml (include "gennstack-serving.stagedGates" $root)) $gen.pool }}
---
# The compile upload records its artifacts in its own generation's marker, and nothing else.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $gen.pool }}-compile-marker
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["patch"]
    resourceNames: [{{ include "gennstack-serving.stagedConfigMap" $gen | quote }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $gen.pool }}-compile-marker
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $gen.pool }}-compile-marker
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ $root.Release.Namespace }}
{{- with $gate }}
{{- $kinds := dict }}
{{- range $t := .targets }}
{{- $_ := set $kinds $t.kind (append (get $kinds $t.kind | default list) $t.name) }}
{{- end }}
---
# Once its upload completes the marker, it opens its own generation's gate (files/kube_patch.py
# open_gate): the objects that gate closes, all in this namespace (Neuron generations have no
# multi-node group).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $gen.pool }}-compile-open-gate
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
rules:
  {{- include "gennstack-serving.openGateRules" $kinds | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $gen.pool }}-compile-open-gate
  labels:
    {{- include "gennstack-serving.labels" $root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $gen.pool }}-compile-open-gate
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end }}

{{/* The rules that open a gate's objects, from a dict kind -> [names] (of one namespace): patch on
the named Deployments and LeaderWorkerSets, get and patch on the named RayService (its worker groups
are a list, which a merge patch replaces whole, so kube_patch.py reads first). Only kinds present get
a rule: never an empty resourceNames, which RBAC reads as "every name" (rbac/v1 PolicyRule.resourceNames). */}}
{{- define "gennstack-serving.openGateRules" -}}
{{- with .Deployment }}
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["patch"]
  resourceNames:
    {{- toYaml (sortAlpha .) | nindent 4 }}
{{- end }}
{{- with .LeaderWorkerSet }}
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["patch"]
  resourceNames:
    {{- toYaml (sortAlpha .) | nindent 4 }}
{{- end }}
{{- with .RayService }}
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["get", "patch"]
  resourceNames:
    {{- toYaml (sortAlpha .) | nindent 4 }}
{{- end }}
{{- end }}

{{/*
With staging off, the compile Jobs still running: the live Job of the name this release renders
(helm's `lookup`) is released (spec.suspend false) and has no Complete or Failed condition (batch/v1
JobStatus.conditions). Such a Job stays in the manifest, unchanged, so turning staging off does not
delete it (helm deletes what a release no longer renders, with its pod: an on-demand accelerator
node's compile lost mid-way), and so do the gates ConfigMap (gennstack-serving.recording) and its
compile account's Roles (gennstack-serving.compileRbac), which its upload needs to record and to
open the gate. A suspended one (its stage Job had not finished) is
dropped: nothing ran on an accelerator yet. Once it has ended, the next upgrade drops it; its
ttlSecondsAfterFinished deletes it a day after it ends in any case. `helm template` has no cluster:
nothing is kept there. JSON list of {name (generation), compileJob, stageJob}. Call with the root context.
*/}}
{{- define "gennstack-serving.keptCompileJobs" -}}
{{- $kept := list }}
{{- if not .Values.staging.enabled }}
{{- range $name := list "inf2" "trn2" "g6e" }}
{{- if (index $.Values $name).enabled }}
{{- $gen := fromYaml (include "gennstack-serving.gen" (dict "root" $ "name" $name)) }}
{{- $compileJob := include "gennstack-serving.compileJobName" (dict "root" $ "gen" $gen) }}
{{- $live := lookup "batch/v1" "Job" $.Release.Namespace $compileJob }}
{{- if and $live (not (dig "spec" "suspend" true $live)) }}
{{- $ended := false }}
{{- range $c := (dig "status" "conditions" (list) $live) }}
{{- if and (has $c.type (list "Complete" "Failed")) (eq (toString $c.status) "True") }}
{{- $ended = true }}
{{- end }}
{{- end }}
{{- if not $ended }}
{{- $kept = append $kept (dict "name" $name "compileJob" $compileJob "stageJob" (dig "metadata" "annotations" "gennstack.io/released-by" "" $live)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $kept }}
{{- end }}
