# Writes OUT with `#define OSPREY_GIT_COMMIT "<12 hex>[-dirty]"` (or "unknown" outside a git tree),
# only when the text changes, so the files that include it rebuild only then. Run with
# cmake -DSRC=<source dir> -DOUT=<header> -P git_commit.cmake (CMakeLists.txt does, every build).
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT commit)
  set(commit unknown)
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SRC} RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define OSPREY_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
