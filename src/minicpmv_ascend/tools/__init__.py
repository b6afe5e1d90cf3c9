"""The offline tools: what a developer or an operator runs beside the server, never the server
itself (the runtime imports nothing from here; tests/test_architecture.py checks it).

    bench, bench_report, roofline   `make bench` / minicpmv-bench: vLLM's benchmark over a matrix, rooflines
    parity, parity_prompts          `make parity` / minicpmv-parity: does an endpoint answer like the reference?
    fuzz, fuzz_hooks                `make fuzz` / minicpmv-fuzz: schemathesis from the server's /openapi.json
    lifecycle                       start a server, wait until it is ready, stop it (the tests use it too)
    features, targets               the API feature table and the Ascend targets table, rendered for the docs
    advisories                      the targets' vLLM security advisories and the kit's verdicts, for the docs
"""
