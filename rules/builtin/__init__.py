"""The built-in rules, one module each: everything about a rule lives in its module.

    rules/builtin/fd_exhaustion.py
        RANK = 2            ties between equally severe, equally confident findings
        FD_RATIO = 0.9      its thresholds, commented with where the number comes from
        def enrich(ctx, finding)   the subjects a finding names (pids, CPUs, binaries ...)
        def scenario(k)            the scenario bundle that proves it
        RULE = Rule(...)    symptom, cause, action, condition (= the exported PromQL),
                            evidence, severity tiers, console views, proof, and the
                            fleet fault: where the simulated fleet injects it and how it
                            moves the metrics (rules/fleet.py)

rules/catalog.py imports every module here and registers its RULE. Adding a rule is one
module here and its runbook, runbooks/<rule id>.md (tests check each has the other); the
ids, the diagnosis schema's enum, `rules list`/`rules export`, the console, the scenario
bundles and the simulated fleet's faults all follow from the registry.
"""
