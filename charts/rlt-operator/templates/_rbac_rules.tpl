{{/*
The operator's permissions, verb by verb. They must equal rlt_operator.rbac.RBAC_RULES
(tests/chart/test_rbac.py compares them); change both together.
*/}}

{{/* Rules on namespaced resources: granted cluster-wide, or per watched namespace in namespaced mode. */}}
{{- define "rlt-operator.namespacedRules" -}}
- apiGroups: ["rlt.dev"]
  resources: ["rltruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["rlt.dev"]
  resources: ["rltruns/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps", "persistentvolumeclaims", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}

{{/* Rules on cluster-scoped resources (Kopf's discovery of the CRD and, in cluster mode, of namespaces). */}}
{{- define "rlt-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if not (include "rlt-operator.namespaced" .) }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end }}
