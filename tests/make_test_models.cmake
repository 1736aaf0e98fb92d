# CTest fixture: cmake -DPYTHON=... -DSOURCE_DIR=... -DOUT_DIR=... -P make_test_models.cmake
# Regenerates the tiny test-model matrix (tools/make_test_models.py) into OUT_DIR.
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR "${PYTHON} not found: the test models are made by the tools' Python venv; "
                      "run scripts/setup.sh (or: python3 -m venv .venv && .venv/bin/pip install gguf numpy "
                      "tokenizers sentencepiece)")
endif()
execute_process(COMMAND "${PYTHON}" "${SOURCE_DIR}/tools/make_test_models.py" "${OUT_DIR}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tools/make_test_models.py failed (${rc})")
endif()
