{{/* The release's name prefix for every object (63 characters at most, DNS-1123). */}}
{{- define "csi-suite.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "csi-suite.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one workload: (dict "root" $ "component" "controller"). */}}
{{- define "csi-suite.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "csi-suite.controllerServiceAccount" -}}
{{- .Values.serviceAccount.controllerName | default (printf "%s-controller" (include "csi-suite.fullname" .)) -}}
{{- end -}}

{{- define "csi-suite.nodeServiceAccount" -}}
{{- .Values.serviceAccount.nodeName | default (printf "%s-node" (include "csi-suite.fullname" .)) -}}
{{- end -}}

{{/* podmon's controller side: its own ServiceAccount (see serviceaccounts.yaml). */}}
{{- define "csi-suite.podmonControllerServiceAccount" -}}
{{- .Values.serviceAccount.podmonControllerName | default (printf "%s-podmon-controller" (include "csi-suite.fullname" .)) -}}
{{- end -}}

{{/* "true" when the chart restricts podmon's node side to its own Node with a
     ValidatingAdmissionPolicy: asked for (podmon.node.admissionPolicy), and served by the
     cluster (admissionregistration.k8s.io/v1, Kubernetes 1.30+). */}}
{{- define "csi-suite.podmonNodePolicy" -}}
{{- if and .Values.podmon.enabled .Values.podmon.node.admissionPolicy (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}

{{/* A list of strings as CEL string literals, comma-separated. */}}
{{- define "csi-suite.celStrings" -}}
{{- range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s }}'{{ end }}
{{- end -}}

{{/* The inventory CronJob's own ServiceAccount. */}}
{{- define "csi-suite.inventoryServiceAccount" -}}
{{- .Values.serviceAccount.inventoryName | default (printf "%s-inventory" (include "csi-suite.fullname" .)) -}}
{{- end -}}

{{/* An image reference: (dict "root" $ "layers" (list <base> <override> ...)); each layer's
     non-empty repository/tag/pullPolicy overrides the ones before it, and the suite image
     comes first. */}}
{{- define "csi-suite.imageFields" -}}
{{- $image := dict "repository" .root.Values.image.repository "tag" (.root.Values.image.tag | default .root.Chart.AppVersion) "pullPolicy" .root.Values.image.pullPolicy -}}
{{- range $layer := .layers -}}
{{- range $field := list "repository" "tag" "pullPolicy" -}}
{{- with (get ($layer | default dict) $field) -}}
{{- $_ := set $image $field . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $image -}}
{{- end -}}

{{/* The image: and imagePullPolicy: lines of a container. */}}
{{- define "csi-suite.containerImage" -}}
{{- $image := include "csi-suite.imageFields" . | fromJson -}}
image: {{ printf "%s:%s" $image.repository $image.tag }}
imagePullPolicy: {{ $image.pullPolicy }}
{{- end -}}

{{/* The driver socket as every container of a pod sees it. */}}
{{- define "csi-suite.csiAddress" -}}
{{- printf "%s/%s" (.Values.driver.socketDir | trimSuffix "/") .Values.driver.socketName -}}
{{- end -}}

{{/* The controller pod's socket directory on its node, when the inventory CronJob reaches the
     driver there (inventory.cronJob): inventory.cronJob.socketHostDir, by default
     /var/lib/csi-suite/<driver>/controller. */}}
{{- define "csi-suite.controllerSocketHostDir" -}}
{{- .Values.inventory.cronJob.socketHostDir | default (printf "/var/lib/csi-suite/%s/controller" .Values.driver.name) -}}
{{- end -}}

{{/* The node plugin directory on the host: <kubeletDir>/plugins/<driver>. */}}
{{- define "csi-suite.pluginDir" -}}
{{- printf "%s/plugins/%s" (.Values.node.kubeletDir | trimSuffix "/") .Values.driver.name -}}
{{- end -}}

{{/* "true" when the controller sidecars elect a leader: asked for, or more than one replica. */}}
{{- define "csi-suite.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.controller.replicas) 1) -}}
true
{{- else -}}
false
{{- end -}}
{{- end -}}

{{/* The first DNS label of the driver name: the prefix of podmon's taints. */}}
{{- define "csi-suite.driverShortName" -}}
{{- .Values.driver.name | splitList "." | first -}}
{{- end -}}

{{- define "csi-suite.podmonLabelValue" -}}
{{- .Values.podmon.labelValue | default .Values.driver.name -}}
{{- end -}}

{{/* podmon controller finds the driver's node pods by this label (--driverPodLabelKey/Value). */}}
{{- define "csi-suite.driverPodLabelKey" -}}
csi-suite.io/driver-node
{{- end -}}

{{/* A container's args: the chart's own, then .args, then .extraArgs, all rendered as templates. */}}
{{- define "csi-suite.args" -}}
{{- $root := .root -}}
{{- range .own }}
- {{ tpl . $root | quote }}
{{- end }}
{{- range .component.args }}
- {{ tpl . $root | quote }}
{{- end }}
{{- range .component.extraArgs }}
- {{ tpl . $root | quote }}
{{- end }}
{{- end -}}

{{- define "csi-suite.nodeNameEnv" -}}
- name: KUBE_NODE_NAME
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: spec.nodeName
{{- end -}}


{{/* "true" when the containers that call the API get a projected token and no pod automounts
     one: serviceAccount.projectedToken, or with auto, from Kubernetes 1.20, where every
     namespace has the kube-root-ca.crt ConfigMap the projection reads the CA from. */}}
{{- define "csi-suite.projectedToken" -}}
{{- $mode := .Values.serviceAccount.projectedToken -}}
{{- if eq (toString $mode) "auto" -}}
{{- semverCompare ">=1.20.0-0" .Capabilities.KubeVersion.Version -}}
{{- else -}}
{{- $mode -}}
{{- end -}}
{{- end -}}

{{/* A pod's automountServiceAccountToken: (dict "root" $ "callsApi" <bool>). Without projected
     tokens, a pod with a container that calls the API has the token in every container. */}}
{{- define "csi-suite.automountToken" -}}
automountServiceAccountToken: {{ and (ne (include "csi-suite.projectedToken" .root) "true") .callsApi }}
{{- end -}}

{{/* What the kubelet would automount, for one container: a bound token (renewed by the
     kubelet; the clients re-read it every minute), the cluster CA, the namespace. */}}
{{- define "csi-suite.apiAccessVolume" -}}
- name: kube-api-access
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3600
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end -}}

{{- define "csi-suite.apiAccessMount" -}}
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end -}}

{{/* The CSIDriver spec fields the chart sets from csiDriver.<name>, in the order rendered, as
     a YAML list: the release whose storage.k8s.io/v1 CSIDriver first has the field (since), and
     for a field that came behind a feature gate off by default, the gate and the release that
     turns it on by default (onBy; empty: off in every release so far, up to 1.36). The table
     in docs/chart.md says where each comes from. */}}
{{- define "csi-suite.csiDriverFields" -}}
- {name: attachRequired, since: "1.18"}
- {name: podInfoOnMount, since: "1.18"}
- {name: fsGroupPolicy, since: "1.19", gate: CSIVolumeFSGroupPolicy, onBy: "1.20"}
- {name: volumeLifecycleModes, since: "1.18"}
- {name: storageCapacity, since: "1.19", gate: CSIStorageCapacity, onBy: "1.21"}
- {name: tokenRequests, since: "1.20", gate: CSIServiceAccountToken, onBy: "1.21"}
- {name: requiresRepublish, since: "1.20", gate: CSIServiceAccountToken, onBy: "1.21"}
- {name: seLinuxMount, since: "1.25", gate: SELinuxMountReadWriteOncePod, onBy: "1.28"}
- {name: nodeAllocatableUpdatePeriodSeconds, since: "1.33", gate: MutableCSINodeAllocatableCount, onBy: "1.35"}
- {name: serviceAccountTokenInSecrets, since: "1.35"}
- {name: preventPodSchedulingIfMissing, since: "1.36", gate: VolumeLimitScaling, onBy: ""}
{{- end -}}

{{/* The CSIDriver fields the values set, as a JSON object of name -> {value, field}: null and
     empty lists are unset. A field this cluster's API lacks fails the release, unless its value
     is false, which is what a cluster without the field does anyway: then it is left out. */}}
{{- define "csi-suite.csiDriverSpec" -}}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- $spec := dict -}}
{{- range $field := include "csi-suite.csiDriverFields" . | fromYamlArray -}}
{{- $value := index $.Values.csiDriver $field.name -}}
{{- if not (or (kindIs "invalid" $value) (and (kindIs "slice" $value) (empty $value))) -}}
{{- if semverCompare (printf ">=%s.0-0" $field.since) $version -}}
{{- $_ := set $spec $field.name (dict "value" $value "field" $field) -}}
{{- else if not (and (kindIs "bool" $value) (not $value)) -}}
{{- fail (printf "csiDriver.%s needs Kubernetes %s (the first storage.k8s.io/v1 CSIDriver with %s); this cluster is %s" $field.name $field.since $field.name $version) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $spec "serviceAccountTokenInSecrets") (not (hasKey $spec "tokenRequests")) -}}
{{- fail "csiDriver.serviceAccountTokenInSecrets needs csiDriver.tokenRequests: the API server refuses it without" -}}
{{- end -}}
{{- toJson $spec -}}
{{- end -}}

{{/* The /metrics endpoints of a pod, as a YAML list of {name, port}: the name of the container
     port and its number. (dict "root" $ "component" <c>), <c> one of metricsComponents;
     livenessprobe's port is named healthz (the driver container declares it, for its liveness
     probe); the snapshot-controller, cosi-controller and cosi-provisioner (the cosi-driver
     pod) each serve theirs on the port named http. */}}
{{- define "csi-suite.metricsPorts" -}}
{{- $v := .root.Values -}}
{{- $ports := list -}}
{{- if eq .component "controller" -}}
{{- range $name, $sidecar := dict "provisioner" $v.provisioner "attacher" $v.attacher "resizer" $v.resizer "snapshotter" $v.snapshotter "health-monitor" $v.healthMonitor "snapshot-meta" $v.snapshotMetadata -}}
{{- if $sidecar.enabled -}}
{{- $ports = append $ports (dict "name" $name "port" $sidecar.httpPort) -}}
{{- end -}}
{{- end -}}
{{- if $v.podmon.enabled -}}
{{- $ports = append $ports (dict "name" "podmon" "port" $v.podmon.controller.httpPort) -}}
{{- end -}}
{{- if $v.inventory.serve.enabled -}}
{{- $ports = append $ports (dict "name" "inventory" "port" $v.inventory.serve.port) -}}
{{- end -}}
{{- end -}}
{{- if and (has .component (list "controller" "node")) $v.livenessProbe.enabled -}}
{{- $ports = append $ports (dict "name" "healthz" "port" $v.livenessProbe.httpPort) -}}
{{- end -}}
{{- $own := dict "snapshot-controller" $v.snapshotController "cosi-controller" $v.cosi.controller "cosi-driver" (dict "enabled" $v.cosi.driver.enabled "httpPort" $v.cosi.provisioner.httpPort) -}}
{{- with get $own .component -}}
{{- if .enabled -}}
{{- $ports = append $ports (dict "name" "http" "port" .httpPort) -}}
{{- end -}}
{{- end -}}
{{- toYaml $ports -}}
{{- end -}}

{{/* The API version of the controller's PodDisruptionBudget, when there is one
     (controller.podDisruptionBudget; auto: more than one replica): policy/v1 from Kubernetes
     1.21, policy/v1beta1 before. Empty: none. */}}
{{- define "csi-suite.controllerPdbApi" -}}
{{- $enabled := .Values.controller.podDisruptionBudget.enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- $enabled = gt (int .Values.controller.replicas) 1 -}}
{{- end -}}
{{- if $enabled -}}
{{- semverCompare ">=1.21.0-0" .Capabilities.KubeVersion.Version | ternary "policy/v1" "policy/v1beta1" -}}
{{- end -}}
{{- end -}}

{{/* The workloads (app.kubernetes.io/component) that may have a metrics Service. */}}
{{- define "csi-suite.metricsComponents" -}}
{{- list "controller" "node" "snapshot-controller" "cosi-controller" "cosi-driver" | toJson -}}
{{- end -}}

{{/* A sidecar's command: the binary of the suite image its values name (.command); none when
     null or empty, so that an image's own entrypoint runs (upstream's images keep theirs at
     /<binary>, outside PATH). */}}
{{- define "csi-suite.command" -}}
{{- with . }}
command: [{{ join ", " . }}]
{{- end }}
{{- end -}}

{{/* A container's liveness probe on its named port, from its livenessProbe values:
     (dict "probe" <values> "port" <port name> "electing" <bool> "where" <values path>).
     Nothing when enabled is false. A Go sidecar of upstream serves /healthz/leader-election
     only with leader election on, and nothing else: that path without leader election
     would fail every probe, so it is refused. */}}
{{- define "csi-suite.livenessProbe" -}}
{{- with .probe -}}
{{- if .enabled }}
{{- if and (eq .path "/healthz/leader-election") (not $.electing) }}
{{- fail (printf "%s.livenessProbe.path /healthz/leader-election is served only with leader election on (leaderElection.enabled, or more than one replica): set it, or set %s.livenessProbe.enabled: false" $.where $.where) }}
{{- end }}
livenessProbe:
  httpGet:
    path: {{ .path }}
    port: {{ $.port }}
  failureThreshold: {{ .failureThreshold }}
  {{- with .initialDelaySeconds }}
  initialDelaySeconds: {{ . }}
  {{- end }}
  periodSeconds: {{ .periodSeconds }}
  timeoutSeconds: {{ .timeoutSeconds }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* csi-snapshot-metadata's Service (snapshotMetadata.service.name, by default
     <fullname>-snapshot-metadata). */}}
{{- define "csi-suite.snapshotMetadataService" -}}
{{- .Values.snapshotMetadata.service.name | default (printf "%s-snapshot-metadata" (include "csi-suite.fullname" .)) -}}
{{- end -}}

{{/* The audience of backup applications' tokens: snapshotMetadata.audience, by default
     snapshot-metadata.<driver.name>. */}}
{{- define "csi-suite.snapshotMetadataAudience" -}}
{{- .Values.snapshotMetadata.audience | default (printf "snapshot-metadata.%s" .Values.driver.name) -}}
{{- end -}}

{{/* The kubernetes.io/tls Secret csi-snapshot-metadata serves with: the user's
     (snapshotMetadata.tls.existingSecret) or the chart's <fullname>-snapshot-metadata-tls. */}}
{{- define "csi-suite.snapshotMetadataTlsSecret" -}}
{{- .Values.snapshotMetadata.tls.existingSecret | default (printf "%s-snapshot-metadata-tls" (include "csi-suite.fullname" .)) -}}
{{- end -}}
