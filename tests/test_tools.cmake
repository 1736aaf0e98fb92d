# CTest test: cmake -DPYTHON=... -DSOURCE_DIR=... -P test_tools.cmake runs the model tooling's self-tests.
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR "${PYTHON} not found: run scripts/setup.sh to make the tools' Python venv")
endif()
execute_process(COMMAND "${PYTHON}" "${SOURCE_DIR}/tools/test_tools.py" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tools/test_tools.py failed (${rc})")
endif()
