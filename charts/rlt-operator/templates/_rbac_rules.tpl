{{/*
The operator's permissions, verb by verb. They must equal rlt_operator.rbac.RBAC_RULES and
CLUSTER_RBAC_RULES (tests/chart/test_rbac.py compares them, order included); change both together.
docs/operator.md and the chart README explain where each verb comes from.
*/}}

{{/* Rules on namespaced resources: a ClusterRole in cluster mode, a Role per watched namespace otherwise. */}}
{{- define "rlt-operator.namespacedRules" -}}
- apiGroups: ["rlt.dev"]
  resources: ["rltruns"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["rlt.dev"]
  resources: ["rltruns/status"]
  verbs: ["patch"]
- apiGroups: ["rlt.dev"]
  resources: ["rltruns/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims", "services"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "delete"]
{{- end }}

{{/* Rules on cluster-scoped resources, needed in both modes (Kopf's resource discovery). */}}
{{- define "rlt-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
