{{/* The chart name, overridable. */}}
{{- define "trainjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every resource: <release>-<chart>, or the release name when it already
contains the chart name; at most 63 characters (DNS label).
*/}}
{{- define "trainjob-operator.fullname" -}}
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

{{/* chart label value: <name>-<version>. */}}
{{- define "trainjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods (stable across upgrades). */}}
{{- define "trainjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every object of the chart. */}}
{{- define "trainjob-operator.labels" -}}
helm.sh/chart: {{ include "trainjob-operator.chart" . }}
{{ include "trainjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: trainjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "trainjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest, else repository:tag (default: appVersion). */}}
{{- define "trainjob-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* true when the operator serves every namespace (ClusterRole mode). */}}
{{- define "trainjob-operator.clusterwide" -}}
{{- if empty .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/* Refuse settings that cannot work together, at render time. */}}
{{- define "trainjob-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: replicas without leader election would all write to the same TrainJobs" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not (and .Values.metrics.enabled .Values.metrics.service.enabled)) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled and metrics.service.enabled" }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs in every namespace it serves (a ClusterRole's rules in
cluster-wide mode, a Role's in each watched namespace). One comment per rule says why.
No wildcards, no Secrets, no ConfigMaps.
*/}}
{{- define "trainjob-operator.rules" -}}
# Watch TrainJobs (kopf list/watch), read one whose watched copy is behind our own write (get),
# remove the finalizer an earlier release added (patch), delete finished jobs after
# ttlSecondsAfterFinished.
- apiGroups: [trainjob.dev]
  resources: [trainjobs]
  verbs: [get, list, watch, patch, delete]
# Write conditions, replica statuses and timestamps (the status subresource, merge patch).
- apiGroups: [trainjob.dev]
  resources: [trainjobs/status]
  verbs: [patch]
# Children carry a controller ownerReference with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only with update on finalizers.
- apiGroups: [trainjob.dev]
  resources: [trainjobs/finalizers]
  verbs: [update]
# One Pod per replica: index and watch them (list/watch), create them, delete them on restart,
# suspend, clean-up (cleanPodPolicy) and deadlines.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete]
# A failed replica of one's own command whose termination message names no exception: the
# tail of its log is read once for the exception that ended it (bounded in lines and bytes).
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# One headless Service per replica (the TF_CONFIG host names): same life cycle as the Pods.
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, delete]
# Record what happened on the TrainJob (kubectl describe tj): our Events and kopf's warnings;
# delete withdraws the Events of a decision that was superseded before it was recorded, patch
# rewords an Event posted already when the same transition is decided again.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, delete]
{{- if .Values.networkPolicy.enabled }}
# One NetworkPolicy per TrainJob (only its own replicas reach its TensorFlow ports), created
# before its Pods; the garbage collector deletes it with the job (ownerReference).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
{{- end }}
{{- if .Values.tfjob.enabled }}
# Kubeflow's TFJobs (--tfjob): watched (list/watch), read afresh (get), the engine's record
# kept in an annotation (patch; the spec is never written), deleted after
# ttlSecondsAfterFinished; their status written in TFJob's vocabulary; children carry a
# blocking controller ownerReference to them (finalizers).
- apiGroups: [kubeflow.org]
  resources: [tfjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [kubeflow.org]
  resources: [tfjobs/status]
  verbs: [patch]
- apiGroups: [kubeflow.org]
  resources: [tfjobs/finalizers]
  verbs: [update]
{{- end }}
{{- if .Values.kueue.enabled }}
# Kueue: one Workload per queued TrainJob. Index and watch them (list/watch) with the Pods,
# create it, keep its PodsReady/Finished conditions and clear an evicted admission (status
# patch), drop its resource-in-use finalizer (patch), replace it when the job changed (delete),
# and read a prebuilt one (get, MultiKueue workers).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch, delete]
# Kueue's protocol on the Workload's status: PodsReady, Finished, an evicted admission cleared.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
{{- if eq .Values.gangScheduler.type "volcano" }}
# Gang scheduling with Volcano: one PodGroup per TrainJob, created before its Pods (which wait
# until Volcano enqueues it), watched for its phase, updated when minAvailable changes,
# deleted after the Pods.
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, list, watch, create, patch, delete]
{{- else if eq .Values.gangScheduler.type "scheduler-plugins" }}
# Gang scheduling with scheduler-plugins' Coscheduling: one PodGroup per TrainJob, created
# before its Pods, watched for its phase, updated when minAvailable changes, deleted after
# the Pods.
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}
{{- if ne .Values.gangScheduler.type "none" }}
# minResources of a gang: the replica templates' PriorityClass values order which Pods count.
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}
{{- end }}
