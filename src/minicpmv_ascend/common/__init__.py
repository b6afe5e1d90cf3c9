"""What the kit's host tools and its runtime share: standard library only, Python 3.7 or newer.

These modules run on an Ascend host's own Python (Kylin V10 and EulerOS ship 3.7: the probe,
scripts/verify_model_dir.py) as well as in the images, so they import nothing outside the standard
library and nothing else of this package, and use no syntax or library call newer than 3.7
(tests/test_architecture.py checks both).

    http        the one HTTP client (bounded time per request, one-line errors)
    api_key     the one API-key reader (VLLM_API_KEY or the file API_KEY_FILE names)
    model_files is a checkpoint directory complete?
    models      the declared MiniCPM-V models
    release_shape what a released 4.7 carries beyond complete files (canvas field, template, ...)
"""
