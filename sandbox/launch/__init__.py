"""The launch side, run in the supervisor: one launcher per backend (process, bwrap,
docker), cgroups, per-sandbox uids and the warden. Never imports `clawsup.sandbox.host`
and never runs plugin code."""
