{{/*
Pod spec of a Spark job (compaction or replay). Call with
(dict "ctx" $ "name" "compact" "command" "timers-compact" "args" LIST).
*/}}
{{- define "kafka-timers.sparkPodSpec" -}}
{{- $ := .ctx }}
{{- $jobs := $.Values.jobs }}
{{- include "kafka-timers.podCommon" $ }}
serviceAccountName: {{ include "kafka-timers.serviceAccountName" $ }}
restartPolicy: Never
containers:
  - name: {{ .name }}
    image: {{ include "kafka-timers.jobsImage" $ }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    command: [{{ .command | quote }}]
    # Relative paths land on the snapshot volume: `timers-compact` without --out writes to
    # snapshots/<UTC time>, and `timers-replay --snapshot snapshots/<time>` reads it back.
    workingDir: /var/lib/kafka-timers
    args:
      - --master
      - {{ $jobs.sparkMaster | quote }}
      {{- range .args }}
      - {{ . | quote }}
      {{- end }}
    envFrom:
      - configMapRef:
          name: {{ include "kafka-timers.fullname" $ }}-common
    env:
      - name: TIMERS_APP_ID
        value: {{ $.Values.worker.appId | quote }}
      # Spark and the JVM write scratch files under HOME and java.io.tmpdir: both on the writable /tmp.
      - name: HOME
        value: /tmp
    resources:
      {{- toYaml $jobs.resources | nindent 6 }}
    securityContext:
      {{- toYaml $.Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: snapshots
        mountPath: /var/lib/kafka-timers/snapshots
      {{- include "kafka-timers.baseVolumeMounts" $ | nindent 6 }}
volumes:
  - name: snapshots
    persistentVolumeClaim:
      claimName: {{ include "kafka-timers.snapshotsClaim" $ }}
  {{- include "kafka-timers.volumes" (dict "ctx" $ "tmpSizeLimit" $jobs.tmpSizeLimit) | nindent 2 }}
{{- end }}

{{- define "kafka-timers.snapshotsClaim" -}}
{{- default (printf "%s-snapshots" (include "kafka-timers.fullname" .)) .Values.jobs.snapshots.existingClaim }}
{{- end }}
