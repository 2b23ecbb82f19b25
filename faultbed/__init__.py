"""The failure-injection test bed: fault plans, where and when each fault fires, and (later) the fault proxy
and the chaos runner that checks the invariants of a run from the service's records and the histories."""
