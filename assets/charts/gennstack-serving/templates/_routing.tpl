{{/*
Drain routing. Server pods start with gennstack.io/routable: "true" and their Services select it;
the Deployments' selectors do not, so the interruption handler setting it to "false" on a doomed
node's pods takes them out of the Service's endpoints (and the headless Service's DNS answer) while
they keep running and finish the streams they hold. See docs/spot-drills.md.
*/}}
{{- define "gennstack-serving.routableLabel" -}}
gennstack.io/routable: "true"
{{- end }}
