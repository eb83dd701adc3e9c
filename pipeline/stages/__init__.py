"""The stages, one package (or module) each, in the order the runner runs them:

    quantize/    ModelOpt PTQ and the exports the build target reads
    evaluate.py  quality against the unquantized model, and the quality gate
    build/       per target: engine (trtllm-build), llmapi (LLM-API folder), torch (LPX's reference engine)
    repository/  the Triton model repository (config.pbtxt as ModelConfig messages, LPX's python models)
    serving (STAGES' last step) writes no artifact: pipeline/served.py composes it from these stages
                 and the processes of pipeline/servers/

Each stage owns three things and the runner (pipeline/runner.py) only orders them and reports:
    check(ctx, variant)        what can be refused before any work (a UsageError naming the fix)
    inputs(ctx, variant, ...)  everything that shapes the output, hashed into the artifact's key
                               (pipeline/cache_keys.py): upstream keys, config values, the generated
                               argv / config.pbtxt / options, tool versions, and `code`: the
                               fingerprint of the modules listed in its CODE
    run(ctx, variant, ..., out) write the output into the staging folder `out`; returns the manifest's results
"""

STAGES = ("quantize", "eval", "build", "repo", "serve")
