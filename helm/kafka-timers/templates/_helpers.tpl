{{/* Chart name, at most 63 characters (a DNS label). */}}
{{- define "kafka-timers.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every resource name: "<release>-kafka-timers", or the release name alone when it
already contains the chart name. At most 40 characters, so every derived name fits its limit
(e.g. a StatefulSet name plus its 11-character revision hash must fit a 63-character label).
*/}}
{{- define "kafka-timers.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kafka-timers.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-timers.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-timers.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka-timers.labels" -}}
helm.sh/chart: {{ include "kafka-timers.chart" . }}
{{ include "kafka-timers.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kafka-timers
{{- end }}

{{/* Selector labels of one component. Call with (dict "ctx" $ "component" "worker"). */}}
{{- define "kafka-timers.componentSelectorLabels" -}}
{{ include "kafka-timers.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component. Call with (dict "ctx" $ "component" "worker"). */}}
{{- define "kafka-timers.componentLabels" -}}
{{ include "kafka-timers.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kafka-timers.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-timers.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The services image: repository@digest or repository:tag. */}}
{{- define "kafka-timers.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Spark jobs image (the Dockerfile's "jobs" target). */}}
{{- define "kafka-timers.jobsImage" -}}
{{- $repository := default .Values.image.repository .Values.jobs.image.repository }}
{{- if .Values.jobs.image.digest }}
{{- printf "%s@%s" $repository .Values.jobs.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default (printf "%s-jobs" .Chart.AppVersion) .Values.jobs.image.tag) }}
{{- end }}
{{- end }}

{{/* KAFKA_SECURITY_PROTOCOL, derived from the sasl and tls switches so they cannot disagree. */}}
{{- define "kafka-timers.securityProtocol" -}}
{{- $k := .Values.kafka }}
{{- if and $k.sasl.enabled $k.tls.enabled }}SASL_SSL
{{- else if $k.sasl.enabled }}SASL_PLAINTEXT
{{- else if $k.tls.enabled }}SSL
{{- else }}PLAINTEXT
{{- end }}
{{- end }}

{{- define "kafka-timers.tlsMountPath" -}}/etc/kafka-timers/tls{{- end }}

{{/* Where the SASL credentials are mounted, as the files "username" and "password". */}}
{{- define "kafka-timers.saslMountPath" -}}/etc/kafka-timers/sasl{{- end }}

{{/*
Settings every component reads: Kafka connection (no credentials) and topic names, as a YAML map
of environment variables. Rendered into the common ConfigMap, and inline into the pre-install Job,
which runs before the release's ConfigMaps exist.
TIMERS_BROKER_PROFILE is never set: its default, "cluster", is the only one for a real Kafka.
*/}}
{{- define "kafka-timers.commonEnv" -}}
{{- $k := .Values.kafka -}}
{{- if not $k.bootstrapServers -}}
{{- fail "kafka.bootstrapServers is empty: set it to your brokers, e.g. --set kafka.bootstrapServers=kafka-0.kafka:9092" -}}
{{- end -}}
KAFKA_BOOTSTRAP_SERVERS: {{ $k.bootstrapServers | quote }}
KAFKA_SECURITY_PROTOCOL: {{ include "kafka-timers.securityProtocol" . | quote }}
{{- if $k.sasl.enabled }}
KAFKA_SASL_MECHANISM: {{ $k.sasl.mechanism | quote }}
# Files of the mounted Secret: the credentials never enter a process environment.
KAFKA_SASL_USERNAME_FILE: {{ printf "%s/username" (include "kafka-timers.saslMountPath" .) | quote }}
KAFKA_SASL_PASSWORD_FILE: {{ printf "%s/password" (include "kafka-timers.saslMountPath" .) | quote }}
{{- end }}
{{- if $k.tls.enabled }}
{{- if $k.tls.caSecret }}
KAFKA_SSL_CA_LOCATION: {{ printf "%s/%s" (include "kafka-timers.tlsMountPath" .) $k.tls.caKey | quote }}
{{- else }}
KAFKA_SSL_CA_LOCATION: "probe"
{{- end }}
{{- end }}
TIMERS_TOPIC_OSCILLATOR: {{ .Values.topics.names.oscillator | quote }}
TIMERS_TOPIC_REQUEST: {{ .Values.topics.names.request | quote }}
TIMERS_TOPIC_EVENTS: {{ .Values.topics.names.events | quote }}
TIMERS_TOPIC_DLQ: {{ .Values.topics.names.dlq | quote }}
{{- with .Values.topics.ingress }}
{{- $pairs := list }}
{{- range . }}
{{- $pairs = append $pairs (join ":" (prepend (.allowedCallbackTopics | default list) (printf "%s=%s" .name .format))) }}
{{- end }}
TIMERS_INGRESS_TOPICS: {{ join "," $pairs | quote }}
{{- end }}
TIMERS_PARTITIONS: {{ .Values.topics.partitions | int64 | quote }}
{{- end }}

{{/* Name of the Secret with the SASL credentials: the user's, or the chart's. */}}
{{- define "kafka-timers.kafkaSecretName" -}}
{{- if .Values.kafka.sasl.existingSecret }}
{{- .Values.kafka.sasl.existingSecret }}
{{- else }}
{{- printf "%s-kafka" (include "kafka-timers.fullname" .) }}
{{- end }}
{{- end }}

{{/* Fails the render when the chart must create the SASL Secret but has nothing to put in it. */}}
{{- define "kafka-timers.checkSasl" -}}
{{- $v := .Values.kafka.sasl }}
{{- if and $v.enabled (not $v.existingSecret) (not (and $v.username $v.password)) }}
{{- fail "kafka.sasl.enabled needs kafka.sasl.existingSecret (recommended) or both kafka.sasl.username and kafka.sasl.password" }}
{{- end }}
{{- end }}

{{/*
A Secret's keys as read-only files. Call with (dict "name" VOLUME "secret" NAME "items" (dict KEY PATH)).
The files belong to root and to the pod's fsGroup, which may read them; nobody else may.
*/}}
{{- define "kafka-timers.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      {{- range $key, $path := .items }}
      - key: {{ $key }}
        path: {{ $path }}
      {{- end }}
{{- end }}

{{/*
Volumes every pod has: a writable /tmp (the root filesystem is read-only), the CA bundle and the
SASL credentials. Call with (dict "ctx" $), plus "tmpSizeLimit" for another size than tmpSizeLimit
and "saslSecret" for another Secret than kafka-timers.kafkaSecretName (the pre-install Job's).
*/}}
{{- define "kafka-timers.volumes" -}}
{{- $ := .ctx -}}
{{- $k := $.Values.kafka -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ default $.Values.tmpSizeLimit .tmpSizeLimit }}
{{- if and $k.tls.enabled $k.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $k.tls.caSecret }}
    items:
      - key: {{ $k.tls.caKey }}
        path: {{ $k.tls.caKey }}
{{- end }}
{{- if $k.sasl.enabled }}
{{- $own := ne $k.sasl.existingSecret "" }}
{{- $items := dict (ternary $k.sasl.usernameKey "username" $own) "username" }}
{{- $_ := set $items (ternary $k.sasl.passwordKey "password" $own) "password" }}
{{- $secret := default (include "kafka-timers.kafkaSecretName" $) .saslSecret }}
{{ include "kafka-timers.secretVolume" (dict "name" "kafka-sasl" "secret" $secret "items" $items) }}
{{- end }}
{{- end }}

{{- define "kafka-timers.baseVolumes" -}}
{{ include "kafka-timers.volumes" (dict "ctx" .) }}
{{- end }}

{{- define "kafka-timers.baseVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: {{ include "kafka-timers.tlsMountPath" . }}
  readOnly: true
{{- end }}
{{- if .Values.kafka.sasl.enabled }}
- name: kafka-sasl
  mountPath: {{ include "kafka-timers.saslMountPath" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The worker's own Secrets, as files: the admin tokens and the Schema Registry's user:password. */}}
{{- define "kafka-timers.workerSecretVolumes" -}}
{{- $v := .Values.worker -}}
{{- with $v.admin.tokenSecret }}
{{ include "kafka-timers.secretVolume" (dict "name" "admin-token" "secret" . "items" (dict $v.admin.tokenKey "token")) }}
{{- end }}
{{- with $v.admin.readTokenSecret }}
{{ include "kafka-timers.secretVolume" (dict "name" "admin-read-token" "secret" . "items" (dict $v.admin.readTokenKey "token")) }}
{{- end }}
{{- if and $v.schemaRegistry.url $v.schemaRegistry.basicAuthSecret }}
{{ include "kafka-timers.secretVolume" (dict "name" "registry-auth" "secret" $v.schemaRegistry.basicAuthSecret "items" (dict $v.schemaRegistry.basicAuthKey "userInfo")) }}
{{- end }}
{{- end }}

{{- define "kafka-timers.workerSecretMounts" -}}
{{- $v := .Values.worker -}}
{{- if $v.admin.tokenSecret }}
- name: admin-token
  mountPath: /etc/kafka-timers/admin-token
  readOnly: true
{{- end }}
{{- if $v.admin.readTokenSecret }}
- name: admin-read-token
  mountPath: /etc/kafka-timers/admin-read-token
  readOnly: true
{{- end }}
{{- if and $v.schemaRegistry.url $v.schemaRegistry.basicAuthSecret }}
- name: registry-auth
  mountPath: /etc/kafka-timers/registry
  readOnly: true
{{- end }}
{{- end }}

{{/* Pod-spec fields shared by every pod of the release. */}}
{{- define "kafka-timers.podCommon" -}}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Affinity of a component: the user's, if any; else anti-affinity over nodes as asked.
Call with (dict "ctx" $ "component" "oscillator" "values" .Values.oscillator).
*/}}
{{- define "kafka-timers.affinity" -}}
{{- $v := .values -}}
{{- if $v.affinity }}
affinity:
  {{- toYaml $v.affinity | nindent 2 }}
{{- else if eq $v.antiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "kafka-timers.componentSelectorLabels" (dict "ctx" .ctx "component" .component) | nindent 14 }}
{{- else if eq $v.antiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kafka-timers.componentSelectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end }}
{{- if $v.zoneSpread.enabled }}
topologySpreadConstraints:
  - maxSkew: {{ $v.zoneSpread.maxSkew }}
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: {{ $v.zoneSpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "kafka-timers.componentSelectorLabels" (dict "ctx" .ctx "component" .component) | nindent 8 }}
{{- end }}
{{- end }}

{{/* An HTTP probe from a values block. Call with (dict "probe" .Values.x.livenessProbe "path" "/healthz"). */}}
{{- define "kafka-timers.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: http
{{- with .probe.initialDelaySeconds }}
initialDelaySeconds: {{ . }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end }}

{{/* prometheus.io/* pod annotations, when scraping by annotation is on. Call with (dict "ctx" $ "port" N). */}}
{{- define "kafka-timers.scrapeAnnotations" -}}
{{- $m := .ctx.Values.metrics -}}
{{- if and $m.scrapeAnnotations (not $m.serviceMonitor.enabled) -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* Callback topics the worker accepts: a list of patterns, plus the helm test topic when the list is not empty. Call with (dict "ctx" $ "topics" list). */}}
{{- define "kafka-timers.allowedCallbackTopics" -}}
{{- $topics := .topics }}
{{- if and $topics .ctx.Values.tests.enabled }}
{{- $topics = append $topics .ctx.Values.tests.callbackTopic | uniq }}
{{- end }}
{{- join "," $topics }}
{{- end }}
