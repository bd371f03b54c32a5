"""The spot-interruption handler: Lambda functions that pre-warm replacement capacity.

The function code is ``lambdas/interruption_handler`` (see its README for the logic and what it
relies on); this construct gives it its triggers, table, dead-letter queue, network path and its
narrow access to the cluster.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, Aws, Duration, RemovalPolicy, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs

from constructs import Construct
from gennstack_infra.paths import BUILD, LAMBDAS
from gennstack.config import GenNStackConfig
from gennstack.observability.names import INTERRUPTION_METRICS_NAMESPACE, INTERRUPTION_SERVICE_NAME
from gennstack.serving.multinode import warm_spare_group_name, warm_spare_namespace

FUNCTION_SOURCE = LAMBDAS
LAYER_DIR = BUILD / "lambda-layer"
KUBERNETES_GROUP = "gennstack:warm-spare-scalers"
# A second group for drain routing: list nodes, list and label serving pods (see lambdas/.../drain.py).
DRAIN_GROUP = "gennstack:serving-drainers"
ROUTABLE_LABEL = "gennstack.io/routable"
# The scale-down order the reconciler keeps on serving pods (lambdas/interruption_handler/return_to_spot.py
# DELETION_COST: on-demand, spot, reserved); tests compare the two.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DELETION_COSTS = ("-200", "-100", "0", "100")  # -200: a return-to-spot move's drained pod (MOVE_OUT_DELETION_COST)
# Return to spot (lambdas/interruption_handler/spot_move.py): the annotation holding a move's state on
# the generation's ScaledObject, whose minReplicaCount the move raises by one and puts back.
MOVE_STATE_ANNOTATION = "gennstack.io/return-to-spot"
SCALED_OBJECT_FIXED_FIELDS = ("scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
                              "idleReplicaCount", "maxReplicaCount", "advanced", "triggers", "fallback")
# The handler's DynamoDB calls (boto3 Table methods -> IAM actions); tests read the handler's code
# for its table calls and compare.
TABLE_ACTIONS = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Scan")
# config's drain_on signal names -> the handler's Signal values (lambdas/interruption_handler/events.py)
DRAIN_SIGNALS = {"rebalance": "rebalance_recommendation", "warning": "spot_interruption_warning", "scheduled_change": "scheduled_change"}

# The handler's own rules on the default bus (never Karpenter's queue: Karpenter deletes what
# it reads). Detail-types spelled exactly as AWS emits them; tests/test_interruption_handler_stack.py
# checks each against AWS's documented sample event and a near miss.
HANDLER_PATTERNS: dict[str, dict[str, Any]] = {
    "RebalanceRule": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "SpotWarningRule": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "ScheduledChangeRule": {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
    },
    "TerminalStateRule": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        "detail": {"state": ["shutting-down", "terminated", "stopping", "stopped"]},
    },
}


def warm_spares(config: GenNStackConfig, *, namespace: str, baselines: dict[str, int]) -> dict[str, dict[str, Any]]:
    """``WARM_SPARES``: each enabled generation's spot NodePool -> its warm-spare Deployment and bounds,
    and, on the generation of ``serving.multi_node`` while drain routing tells its groups apart
    (``drain_on``'s ``groups``), its warm-spare groups (:func:`group_spares`)."""
    from gennstack_infra.components.node_pools import POOL_NAMES

    cap = config.interruptions.warm_spare_cap
    groups = group_spares(config, namespace=namespace)
    return {
        POOL_NAMES[name]: {
            "generation": name,
            "namespace": namespace,
            "deployment": f"{POOL_NAMES[name]}-warm-spare",
            "baseline": min(baselines.get(name, 0), cap),
            "cap": cap,
            **({"groups": groups} if groups is not None and config.serving.multi_node.generation == name else {}),
        }
        for name in config.generations.enabled()
    }


def group_spares(config: GenNStackConfig, *, namespace: str) -> dict[str, Any] | None:
    """The warm-spare LeaderWorkerSet of ``serving.multi_node`` and its bounds in groups, or None (off,
    or no drain routing on its NodePool: the handler finds a doomed instance's group through the
    groups' pods, which only the drain group may list; the LWS then stays at its baseline).

    The cap is ``interruptions.warm_spare_cap`` and at most ``network.az_count``: spare groups hold a
    zone each among themselves (the chart's exclusive topology in their namespace)."""
    from gennstack_infra.components.node_pools import POOL_NAMES

    multi_node = config.serving.multi_node
    if not multi_node.enabled or not getattr(config.interruptions.drain_on, multi_node.generation):
        return None
    cap = min(config.interruptions.warm_spare_cap, config.network.az_count)
    return {
        "namespace": warm_spare_namespace(namespace),
        "leaderworkerset": warm_spare_group_name(POOL_NAMES[multi_node.generation]),
        "baseline": min(multi_node.warm_spare_replicas, cap),
        "cap": cap,
    }


def drain_on(config: GenNStackConfig) -> dict[str, dict[str, Any]]:
    """``DRAIN_ON``: each enabled generation's spot NodePool -> the signals that drain it and its serving pods' selector."""
    from gennstack_infra.components.node_pools import POOL_NAMES

    configured = config.interruptions.drain_on
    multi_node = config.serving.multi_node
    return {
        POOL_NAMES[name]: {
            "signals": [DRAIN_SIGNALS[signal] for signal in getattr(configured, name)],
            # the serving chart's selectorLabels of the generation's server pods
            "pods": f"app.kubernetes.io/name={POOL_NAMES[name]},app.kubernetes.io/component=server",
            # and of its multi-node groups' pods (templates/multinode-lws.yaml), drained a group at a time
            **({"groups": f"app.kubernetes.io/name={POOL_NAMES[name]}-multinode,app.kubernetes.io/component=server"}
               if multi_node.enabled and multi_node.generation == name else {}),
        }
        for name in config.generations.enabled()
        if getattr(configured, name)
    }


# Generations whose serving replicas are a Deployment's (a ReplicaSet honours pod-deletion-cost): gen1-inf2
# is Ray Serve replicas in a RayCluster and multi-node replicas are LeaderWorkerSet groups (docs/spot-drills.md).
DELETION_COST_GENERATIONS = ("trn2", "g6e")


def deletion_cost(config: GenNStackConfig, *, namespace: str) -> dict[str, dict[str, str]]:
    """``DELETION_COST``: each enabled Deployment generation -> its serving pods, while
    ``interruptions.scale_down_on_demand_first``; ``{}`` otherwise."""
    from gennstack_infra.components.node_pools import POOL_NAMES

    if not config.interruptions.scale_down_on_demand_first:
        return {}
    return {
        name: {"namespace": namespace, "pods": f"app.kubernetes.io/name={POOL_NAMES[name]},app.kubernetes.io/component=server"}
        for name in config.generations.enabled()
        if name in DELETION_COST_GENERATIONS
    }


def return_to_spot(config: GenNStackConfig, *, namespace: str) -> dict[str, Any]:
    """``RETURN_TO_SPOT``: each generation of :func:`deletion_cost` (the move relies on that scale-down
    order) -> its ScaledObject (the serving chart names it after the pool, templates/scaledobjects.yaml),
    and the bounds; ``{}`` while ``interruptions.return_to_spot.enabled`` is off."""
    from gennstack_infra.components.node_pools import POOL_NAMES

    settings = config.interruptions.return_to_spot
    costed = deletion_cost(config, namespace=namespace)
    if not settings.enabled or not costed:
        return {}
    return {
        "generations": {name: {"namespace": namespace, "scaled_object": POOL_NAMES[name]} for name in sorted(costed)},
        "policy": settings.policy(),
    }


def return_to_spot_rbac_manifests(*, namespace: str, scaled_objects: list[str]) -> list[dict[str, Any]]:
    """Get and patch the generations' ScaledObjects (nothing else of KEDA's), for the drain group; a
    ValidatingAdmissionPolicy lets that group change only ``spec.minReplicaCount`` (between 0 and the
    object's ``maxReplicaCount``) and the ``gennstack.io/return-to-spot`` annotation: never the
    triggers, the target or the maximum. RBAC names the resource ``scaledobjects`` in API group
    ``keda.sh`` (KEDA v2.20.2 config/crd/bases/keda.sh_scaledobjects.yaml); ``get`` and ``patch`` are
    the calls the handler makes (lambdas/interruption_handler/kube.py)."""
    name = "gennstack-return-to-spot"
    policy = f"{namespace}-return-to-spot-min-only"
    same_except = (
        "{new}.all(k, k == '{key}' || (k in {old} && {old}[k] == {new}[k])) && {old}.all(k, k == '{key}' || k in {new})"
    )
    # Field by field, not a map comprehension: with the CRD's schema the API server types spec as an
    # object, not a map. Every ScaledObjectSpec field of KEDA v2.20.2 but minReplicaCount
    # (apis/keda/v1alpha1/scaledobject_types.go; tests compare with the CRD's spec properties).
    unchanged_spec = " && ".join(
        f"(has(object.spec.{f}) == has(oldObject.spec.{f}) && (!has(object.spec.{f}) || object.spec.{f} == oldObject.spec.{f}))"
        for f in SCALED_OBJECT_FIXED_FIELDS
    )
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "resourceNames": sorted(scaled_objects),
                       "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DRAIN_GROUP}],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["keda.sh"], "apiVersions": ["v1alpha1"],
                                                        "operations": ["UPDATE"], "resources": ["scaledobjects"]}]},
                "matchConditions": [{"name": "serving-drainers",
                                     "expression": f"has(request.userInfo.groups) && '{DRAIN_GROUP}' in request.userInfo.groups"}],
                "variables": [
                    {"name": "newAnnotations", "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
                    {"name": "oldAnnotations", "expression": "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
                    {"name": "newLabels", "expression": "has(object.metadata.labels) ? object.metadata.labels : {}"},
                    {"name": "oldLabels", "expression": "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"},
                ],
                "validations": [
                    {"expression": unchanged_spec,
                     "message": f"{DRAIN_GROUP} may change only spec.minReplicaCount of a ScaledObject"},
                    {"expression": ("!has(object.spec.minReplicaCount) || (object.spec.minReplicaCount >= 0 && "
                                    "(!has(object.spec.maxReplicaCount) || object.spec.minReplicaCount <= object.spec.maxReplicaCount))"),
                     "message": "spec.minReplicaCount must be between 0 and spec.maxReplicaCount"},
                    {"expression": same_except.format(new="variables.newAnnotations", old="variables.oldAnnotations",
                                                      key=MOVE_STATE_ANNOTATION),
                     "message": f"{DRAIN_GROUP} may change only the {MOVE_STATE_ANNOTATION} annotation of a ScaledObject"},
                    {"expression": "variables.newLabels == variables.oldLabels && "
                                   "(has(object.metadata.finalizers) ? object.metadata.finalizers : []) == "
                                   "(has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : []) && "
                                   "(has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) == "
                                   "(has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])",
                     "message": f"{DRAIN_GROUP} may not change a ScaledObject's labels, finalizers or owners"},
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
        },
    ]


def drain_rbac_manifests(*, namespace: str) -> list[dict[str, Any]]:
    """List nodes (read-only), list and patch pods in the serving namespace; the policy allows one
    label and one annotation only.

    RBAC cannot limit a patch to a field, so a ValidatingAdmissionPolicy bound to the serving
    namespace denies any pod update by this group that changes more than ``gennstack.io/routable``
    (to "true" or "false") and ``controller.kubernetes.io/pod-deletion-cost`` (to one of
    ``DELETION_COSTS``, the reconciler's scale-down order, lambdas/interruption_handler/spot_return.py).
    """
    name = "gennstack-serving-drainer"
    labels = "has(object.metadata.labels) ? object.metadata.labels : {}"
    old_labels = "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
    same = " && ".join(
        f"(has(object.metadata.{f}) ? object.metadata.{f} : {empty}) == (has(oldObject.metadata.{f}) ? oldObject.metadata.{f} : {empty})"
        for f, empty in (("finalizers", "[]"), ("ownerReferences", "[]"))
    )
    costs = ", ".join(f"'{cost}'" for cost in DELETION_COSTS)
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DRAIN_GROUP}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{name}-node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{name}-node-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{name}-node-reader"},
            "subjects": [subject],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [subject],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": f"{namespace}-routing-label-only"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
                    ]
                },
                "matchConditions": [
                    {
                        "name": "serving-drainers",
                        "expression": f"has(request.userInfo.groups) && '{DRAIN_GROUP}' in request.userInfo.groups",
                    }
                ],
                "variables": [
                    {"name": "newLabels", "expression": labels},
                    {"name": "oldLabels", "expression": old_labels},
                    {"name": "newAnnotations", "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
                    {"name": "oldAnnotations", "expression": "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
                ],
                "validations": [
                    {
                        "expression": f"object.spec == oldObject.spec && {same}",
                        "message": f"{DRAIN_GROUP} may change only the {ROUTABLE_LABEL} label of a pod",
                    },
                    {
                        "expression": (
                            f"variables.newLabels.all(k, k == '{ROUTABLE_LABEL}' || (k in variables.oldLabels && "
                            f"variables.oldLabels[k] == variables.newLabels[k])) && variables.oldLabels.all(k, "
                            f"k == '{ROUTABLE_LABEL}' || k in variables.newLabels)"
                        ),
                        "message": f"{DRAIN_GROUP} may change only the {ROUTABLE_LABEL} label of a pod",
                    },
                    {
                        # Unchanged (a deletion-cost patch of a pod without the label), or "true"/"false".
                        "expression": (
                            f"(('{ROUTABLE_LABEL}' in variables.newLabels) == ('{ROUTABLE_LABEL}' in variables.oldLabels) && "
                            f"(!('{ROUTABLE_LABEL}' in variables.newLabels) || variables.newLabels['{ROUTABLE_LABEL}'] == "
                            f"variables.oldLabels['{ROUTABLE_LABEL}'])) || ('{ROUTABLE_LABEL}' in variables.newLabels && "
                            f"variables.newLabels['{ROUTABLE_LABEL}'] in ['true', 'false'])"
                        ),
                        "message": f"{ROUTABLE_LABEL} may only be set to \"true\" or \"false\"",
                    },
                    {
                        "expression": (
                            f"variables.newAnnotations.all(k, k == '{DELETION_COST_ANNOTATION}' || (k in variables.oldAnnotations && "
                            f"variables.oldAnnotations[k] == variables.newAnnotations[k])) && variables.oldAnnotations.all(k, "
                            f"k == '{DELETION_COST_ANNOTATION}' || k in variables.newAnnotations)"
                        ),
                        "message": f"{DRAIN_GROUP} may change only the {DELETION_COST_ANNOTATION} annotation of a pod",
                    },
                    {
                        "expression": (
                            f"!('{DELETION_COST_ANNOTATION}' in variables.newAnnotations) || "
                            f"variables.newAnnotations['{DELETION_COST_ANNOTATION}'] in [{costs}] || "
                            f"('{DELETION_COST_ANNOTATION}' in variables.oldAnnotations && variables.oldAnnotations['{DELETION_COST_ANNOTATION}'] == "
                            f"variables.newAnnotations['{DELETION_COST_ANNOTATION}'])"
                        ),
                        "message": f"{DELETION_COST_ANNOTATION} may only be set to one of {list(DELETION_COSTS)}",
                    },
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": f"{namespace}-routing-label-only"},
            "spec": {
                "policyName": f"{namespace}-routing-label-only",
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        },
    ]


def group_spare_rbac_manifests(groups: dict[str, Any]) -> list[dict[str, Any]]:
    """Get and patch the scale of the one warm-spare LeaderWorkerSet, in its namespace, for the handler's group.

    The LWS v0.10.0 CRD serves a ``scale`` subresource (``spec.versions[].subresources.scale``, from
    ``+kubebuilder:subresource:scale`` in api/leaderworkerset/v1/leaderworkerset_types.go), which RBAC
    names ``leaderworkersets/scale`` in API group ``leaderworkerset.x-k8s.io``; ``get`` and ``patch`` are
    the two calls the handler makes (lambdas/interruption_handler/kube.py). Nothing on the
    LeaderWorkerSet itself, nothing on the serving groups' LeaderWorkerSet."""
    name = "warm-spare-group-scaler"
    namespace = groups["namespace"]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["leaderworkerset.x-k8s.io"],
                    "resources": ["leaderworkersets/scale"],
                    "resourceNames": [groups["leaderworkerset"]],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": KUBERNETES_GROUP}],
        },
    ]


def rbac_manifests(*, namespace: str, deployments: list[str]) -> list[dict[str, Any]]:
    """Get and patch the scale of the warm-spare Deployments, nothing else, for the handler's group."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "warm-spare-scaler", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["apps"],
                    "resources": ["deployments/scale"],
                    "resourceNames": sorted(deployments),
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "warm-spare-scaler", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "warm-spare-scaler"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": KUBERNETES_GROUP}],
        },
    ]


class InterruptionHandler(Construct):
    """EventBridge -> Lambda (in the VPC) -> DynamoDB + the Kubernetes API, with retries and a DLQ.

    Relies on: spot interruption warnings arrive about two minutes ahead and are best-effort;
    rebalance recommendations come earlier and Karpenter ignores them; EventBridge invokes Lambda
    asynchronously, so a failed invocation is retried by Lambda and then dead-lettered, while
    a failed delivery is retried by EventBridge and then dead-lettered; both land in one queue
    with an alarm.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        config: GenNStackConfig,
        vpc: ec2.IVpc,
        private_subnets: ec2.SubnetSelection,
        namespace: str,
        baselines: dict[str, int],
    ) -> None:
        super().__init__(scope, construct_id)
        settings = config.interruptions
        spares = warm_spares(config, namespace=namespace, baselines=baselines)
        drains = drain_on(config)
        costs = deletion_cost(config, namespace=namespace)
        moves = return_to_spot(config, namespace=namespace)

        self.table = dynamodb.TableV2(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            time_to_live_attribute="expires_at",
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Interruption records live minutes; nothing to keep when the stack goes.
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        Validations.of(self.dead_letter_queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the dead-letter queue of the interruption handler; its own alarm fires on the "
                "first message, and a dead-letter queue of a dead-letter queue would hide nothing more.",
            )
        )
        self.alarm = cloudwatch.Alarm(
            self,
            "DeadLetterAlarm",
            metric=self.dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(1), statistic="Maximum"
            ),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="An interruption event or reconcile run failed after all retries; see the "
            "dead-letter queue and the handler's logs.",
        )

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Interruption handler: HTTPS out to the EKS API, AWS APIs and endpoints",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to EKS and AWS APIs")
        cluster.connections.allow_from(self.security_group, ec2.Port.tcp(443), "Interruption handler to the EKS API")

        if not (LAYER_DIR / "python").is_dir():
            raise FileNotFoundError(
                f"{LAYER_DIR} is missing: run `make setup` (it builds the Lambda layer from lambdas/layer-requirements.txt)"
            )
        self.layer = lambda_.LayerVersion(
            self,
            "PowertoolsLayer",
            code=lambda_.Code.from_asset(str(LAYER_DIR)),
            compatible_runtimes=[lambda_.Runtime.PYTHON_3_14],
            compatible_architectures=[lambda_.Architecture.X86_64],
            description="Powertools for AWS Lambda (Python) 3.37.0 with pydantic (lambdas/layer-requirements.txt)",
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.X86_64,
            handler="interruption_handler.handler.lambda_handler",
            code=lambda_.Code.from_asset(
                str(FUNCTION_SOURCE),
                exclude=["**/__pycache__", "**/*.pyc", "**/README.md", "layer-requirements.txt", ".*"],
            ),
            layers=[self.layer],
            memory_size=256,
            timeout=Duration.seconds(60),
            reserved_concurrent_executions=settings.reserved_concurrency or None,
            vpc=vpc,
            vpc_subnets=private_subnets,
            security_groups=[self.security_group],
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=self.dead_letter_queue,
            retry_attempts=2,
            max_event_age=Duration.seconds(settings.max_event_age_seconds),
            environment={
                "CLUSTER_NAME": config.cluster_name,
                "CLUSTER_ENDPOINT": cluster.cluster_endpoint,
                "CLUSTER_CA": cluster.cluster_certificate_authority_data,
                "TABLE_NAME": self.table.table_name,
                # Events of any other account are dropped (ForeignEvents metric, a WARNING line).
                "ACCOUNT_ID": Aws.ACCOUNT_ID,
                "WARM_SPARES": json.dumps(spares, sort_keys=True),
                "DRAIN_ON": json.dumps(drains, sort_keys=True),
                "DELETION_COST": json.dumps(costs, sort_keys=True),
                "RETURN_TO_SPOT": json.dumps(moves, sort_keys=True),
                "RECORD_TTL_SECONDS": str(settings.record_ttl_seconds),
                "REPLACEMENT_GRACE_SECONDS": str(settings.replacement_grace_seconds),
                "POWERTOOLS_SERVICE_NAME": INTERRUPTION_SERVICE_NAME,
                "POWERTOOLS_METRICS_NAMESPACE": INTERRUPTION_METRICS_NAMESPACE,
                "LOG_LEVEL": "INFO",
            },
            description="GenNStack: pre-warms replacement capacity on spot interruption signals",
        )
        self.errors_alarm = cloudwatch.Alarm(
            self,
            "ErrorsAlarm",
            metric=self.function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="The interruption handler failed (it retries; the dead-letter alarm fires when "
            "retries are exhausted). Its logs name the reason.",
        )
        # Exactly the calls the handler makes (lambdas/interruption_handler/interruptions.py: put_item,
        # update_item, scan; the boto3 Table resource never loads itself, so no DescribeTable).
        self.table.grant(self.function, *TABLE_ACTIONS)
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ec2:DescribeInstances"],
                resources=["*"],
                conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}},
            )
        )

        self.rules: dict[str, events.Rule] = {}
        target = targets.LambdaFunction(
            self.function,
            retry_attempts=settings.retry_attempts,
            max_event_age=Duration.seconds(settings.max_event_age_seconds),
            dead_letter_queue=self.dead_letter_queue,
        )
        for rule_id, pattern in HANDLER_PATTERNS.items():
            self.rules[rule_id] = events.Rule(
                self,
                rule_id,
                event_pattern=events.EventPattern(
                    source=pattern["source"], detail_type=pattern["detail-type"], detail=pattern.get("detail")
                ),
                targets=[target],
            )
        self.rules["ReconcileSchedule"] = events.Rule(
            self,
            "ReconcileSchedule",
            schedule=events.Schedule.rate(Duration.minutes(settings.reconcile_every_minutes)),
            targets=[target],
        )

        # The function's role maps to one Kubernetes group, bound to get/patch the warm spares' scale.
        self.access_entry = eks.AccessEntry(
            self,
            "AccessEntry",
            cluster=cluster,
            principal=self.function.role.role_arn,
            access_policies=[],
        )
        cfn_entry = self.access_entry.node.default_child
        # The drain group lists nodes and lists and patches serving pods: drain routing and scale-down order.
        cfn_entry.add_property_override("KubernetesGroups", [KUBERNETES_GROUP, *([DRAIN_GROUP] if drains or costs else [])])
        manifest = rbac_manifests(namespace=namespace, deployments=[s["deployment"] for s in spares.values()])
        if drains or costs:
            manifest += drain_rbac_manifests(namespace=namespace)
        if moves:  # costs is non-empty too: the drain group exists
            manifest += return_to_spot_rbac_manifests(
                namespace=namespace, scaled_objects=[g["scaled_object"] for g in moves["generations"].values()])
        groups = next((s["groups"] for s in spares.values() if "groups" in s), None)
        if groups is not None:
            manifest += group_spare_rbac_manifests(groups)
        self.rbac = eks.KubernetesManifest(self, "Rbac", cluster=cluster, manifest=manifest)
        self._acknowledge()

    def _acknowledge(self) -> None:
        role = self.function.role
        Validations.of(role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole]",
                reason="AWS managed policy for a VPC function's ENIs and logs; the role is assumable only by Lambda.",
            ),
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
                reason="AWS managed policy for the function's CloudWatch Logs; the role is assumable only by Lambda.",
            ),
        )
        Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="ec2:DescribeInstances supports no resource-level permissions; it is read-only and "
                "limited to this region by aws:RequestedRegion. X-Ray's PutTraceSegments likewise.",
            )
        )
