"""The launch side, run in the supervisor: the launcher interface and the backend
names (`launcher`), one launcher per backend (`process`, `bwrap`, `container` for
docker; `backends` picks one), cgroups, who children run as (`run_as`), per-sandbox
uids (`uids`) and the warden. Never imports `clawsup.sandbox.host`
and never runs plugin code."""
