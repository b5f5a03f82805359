{{/* Name of the chart, or nameOverride. */}}
{{- define "bashtask.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: fullnameOverride, else release name (with the chart name unless it contains it). */}}
{{- define "bashtask.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bashtask.controller.fullname" -}}{{ include "bashtask.fullname" . }}-controller{{- end -}}
{{- define "bashtask.agent.fullname" -}}{{ include "bashtask.fullname" . }}-agent{{- end -}}

{{/* The agents' headless Service; the controller finds agents through its EndpointSlices. */}}
{{- define "bashtask.agent.serviceName" -}}{{ include "bashtask.agent.fullname" . }}{{- end -}}

{{/* The name the agents' serving certificate is valid for: the controller's default --agent-server-name. */}}
{{- define "bashtask.agent.serverName" -}}{{ include "bashtask.agent.serviceName" . }}.{{ .Release.Namespace }}.svc{{- end -}}

{{- define "bashtask.controller.serviceAccountName" -}}
{{- default (include "bashtask.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- define "bashtask.agent.serviceAccountName" -}}
{{- default (include "bashtask.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "bashtask.controller.tlsSecret" -}}{{ include "bashtask.controller.fullname" . }}-tls{{- end -}}
{{- define "bashtask.agent.tlsSecret" -}}{{ include "bashtask.agent.fullname" . }}-tls{{- end -}}

{{- define "bashtask.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "bashtask.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bashtask
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "controller"). */}}
{{- define "bashtask.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bashtask.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "bashtask.componentLabels" -}}
{{ include "bashtask.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "bashtask.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The Service in front of every controller replica's output API (the APIService's backend). */}}
{{- define "bashtask.outputAPI.serviceName" -}}{{ include "bashtask.fullname" . }}-output-api{{- end -}}
{{/* The Secret of the output API's serving certificate (tls.crt, tls.key and the ca.crt of the APIService's caBundle). */}}
{{- define "bashtask.outputAPI.tlsSecret" -}}{{ include "bashtask.fullname" . }}-output-api-tls{{- end -}}
{{/* Where the controller reads that Secret (--output-api-cert-dir). */}}
{{- define "bashtask.outputAPI.certDir" -}}/etc/bashtask/output-api-tls{{- end -}}

{{/* The MCP server over HTTP (mcp values, mcp-server.yaml): its objects' name, namespace and ServiceAccount. */}}
{{- define "bashtask.mcp.fullname" -}}{{ include "bashtask.fullname" . }}-mcp{{- end -}}
{{- define "bashtask.mcp.namespace" -}}{{ default .Release.Namespace .Values.mcp.namespace }}{{- end -}}
{{- define "bashtask.mcp.serviceAccountName" -}}
{{- default (include "bashtask.mcp.fullname" .) .Values.mcp.serviceAccount.name -}}
{{- end -}}
{{/* Where the pod reads the API server's CA (the namespace's kube-root-ca.crt ConfigMap). */}}
{{- define "bashtask.mcp.caDir" -}}/etc/bashtask/kube-ca{{- end -}}
