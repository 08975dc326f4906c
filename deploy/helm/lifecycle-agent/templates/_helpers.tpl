{{/* The chart's name (the app.kubernetes.io/name label, also the pods' selector). */}}
{{- define "lifecycle-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name when it already contains the chart's (lifecycle-agent). */}}
{{- define "lifecycle-agent.fullname" -}}
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

{{/* The pods' selector: the kustomize base's, so either install selects the same pods. */}}
{{- define "lifecycle-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lifecycle-agent.name" . }}
{{- end }}

{{/* Every object's labels: the kustomize base's two, and Helm's. */}}
{{- define "lifecycle-agent.labels" -}}
{{ include "lifecycle-agent.selectorLabels" . }}
app.kubernetes.io/part-of: lifecycle
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lifecycle-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lifecycle-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lifecycle-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The CRI socket of criSocket.runtime: a preset's path, criSocket.path for custom, nothing for auto
(the agent tries containerd's, then CRI-O's).
*/}}
{{- define "lifecycle-agent.criSocket" -}}
{{- $presets := dict "containerd" "/run/containerd/containerd.sock" "crio" "/var/run/crio/crio.sock" "k3s" "/run/k3s/containerd/containerd.sock" "microk8s" "/var/snap/microk8s/common/run/containerd.sock" }}
{{- $runtime := .Values.criSocket.runtime }}
{{- if eq $runtime "custom" }}
{{- $path := required "criSocket.path is required with criSocket.runtime custom" .Values.criSocket.path }}
{{- if not (isAbs $path) }}
{{- fail (printf "criSocket.path %q must be absolute" $path) }}
{{- end }}
{{- $path }}
{{- else if hasKey $presets $runtime }}
{{- get $presets $runtime }}
{{- else if ne $runtime "auto" }}
{{- fail (printf "criSocket.runtime %q: one of auto, containerd, crio, k3s, microk8s, custom" $runtime) }}
{{- end }}
{{- end }}

{{/*
updateStrategy, except on a cluster before 1.22, whose API server does not serve DaemonSet
maxSurge (unknown before 1.21, behind a gate that is off in 1.21; helm and kubectl refuse the
field where it is unknown): there a surging rolling update becomes maxUnavailable: 1, the old
agent stopping before the new one starts (deploy/README.md, "Upgrades").
*/}}
{{- define "lifecycle-agent.surgeUnsupported" -}}
{{- $rolling := .Values.updateStrategy.rollingUpdate | default dict }}
{{- if and (hasKey $rolling "maxSurge") (semverCompare "<1.22-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{- define "lifecycle-agent.updateStrategy" -}}
{{- $strategy := deepCopy .Values.updateStrategy }}
{{- if include "lifecycle-agent.surgeUnsupported" . }}
{{- $_ := set $strategy "rollingUpdate" (dict "maxUnavailable" 1) }}
{{- end }}
{{- toYaml $strategy }}
{{- end }}
