{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "kubeinfer.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, or <release>-kubeinfer when the release name lacks "kubeinfer". */}}
{{- define "kubeinfer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubeinfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels of every object of the release, whichever component it belongs to. */}}
{{- define "kubeinfer.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kubeinfer
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kubeinfer.labels" -}}
{{ include "kubeinfer.selectorLabels" . }}
{{ include "kubeinfer.commonLabels" . }}
{{- end -}}

{{/* The activator (templates/activator.yaml): its own component, so that neither Deployment's selector
matches the other's pods. The component value is kubeinfer/contract/activator.py's ACTIVATOR_COMPONENT. */}}
{{- define "kubeinfer.activator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: activator
{{- end -}}

{{- define "kubeinfer.activator.labels" -}}
{{ include "kubeinfer.activator.selectorLabels" . }}
{{ include "kubeinfer.commonLabels" . }}
{{- end -}}

{{/* The activator's name: its Deployment, Service, ServiceAccount and RBAC objects. */}}
{{- define "kubeinfer.activator.fullname" -}}
{{- printf "%s-activator" (include "kubeinfer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeinfer.activator.serviceAccountName" -}}
{{- if .Values.activator.serviceAccount.create -}}
{{- default (include "kubeinfer.activator.fullname" .) .Values.activator.serviceAccount.name -}}
{{- else -}}
{{- required "activator.serviceAccount.name is required when activator.serviceAccount.create is false" .Values.activator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubeinfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubeinfer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubeinfer.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the Prometheus Operator objects should be rendered. */}}
{{- define "kubeinfer.monitoring" -}}
{{- $m := .Values.monitoring.enabled -}}
{{- if eq (toString $m) "true" -}}true
{{- else if and (eq (toString $m) "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true
{{- end -}}
{{- end -}}

{{/* Whether the operator watches all namespaces (cluster-scoped RBAC and peering). */}}
{{- define "kubeinfer.clusterwide" -}}
{{- if not .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The namespaces the operator handles, as JSON: watchNamespaces, plus the release's namespace when the
activator is installed and it is not among them (the operator watches the activator's EndpointSlices
there; kopf watches every kind in every namespace it handles, so the operator's namespaced Role and
peering object go there too). Empty: all namespaces. */}}
{{- define "kubeinfer.operatorNamespaces" -}}
{{- $ns := .Values.watchNamespaces | default list -}}
{{- if and $ns .Values.activator.enabled (not (has .Release.Namespace $ns)) -}}
{{- $ns = append $ns .Release.Namespace -}}
{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* A label map as the operator's settings read it: k=v,k=v (keys sorted). */}}
{{- define "kubeinfer.labelList" -}}
{{- $items := list -}}
{{- range $k, $v := . -}}
{{- $items = append $items (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}
