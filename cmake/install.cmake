# `make install` / `cmake --install BUILD [--prefix DIR]` (issue 20): the `osprey` binary to bin/, the
# static library libosprey.a to lib/, the public headers (include/osprey/*.h, the C API and nothing of
# src/) to include/osprey/, and a pkg-config file lib/pkgconfig/osprey.pc, so that
#   cc app.c $(pkg-config --cflags --libs osprey)
# builds a program against the installed library. The library is static, so the .pc lists what it needs
# (PCRE2, xxHash, jansson; cudart and cuBLASLt in CUDA builds, whose nvcc-compiled objects also want the
# C++ runtime) in Requires / Libs rather than their .private forms. Paths are fixed (bin, lib, include),
# and the .pc finds its prefix from its own directory, so an install tree may be moved.
# Included at the end of CMakeLists.txt; tests/install/test_install.sh checks all of it (ctest: install).
set(OSPREY_PC_CFLAGS "")
set(OSPREY_PC_LIBS "")
if(OSPREY_CUDA)
  set(OSPREY_PC_CFLAGS " -DOSPREY_HAVE_CUDA=1")
  set(OSPREY_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -Wl,-rpath,${CUDAToolkit_LIBRARY_DIR} -lcudart -lstdc++ -ldl -lrt")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/osprey.pc.in ${CMAKE_BINARY_DIR}/osprey.pc @ONLY)

if(TARGET osprey_cli)
  install(TARGETS osprey_cli RUNTIME DESTINATION bin)
endif()
install(TARGETS osprey ARCHIVE DESTINATION lib)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/osprey DESTINATION include FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/osprey.pc DESTINATION lib/pkgconfig)
install(FILES ${CMAKE_SOURCE_DIR}/LICENSE DESTINATION share/doc/osprey)

# Sanitizer and fuzzer builds leave it out: their libosprey.a needs the sanitizer runtimes at link time.
if(OSPREY_SANITIZE OR OSPREY_FUZZ)
  return()
endif()
add_test(NAME install COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/test_install.sh ${CMAKE_BINARY_DIR}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(install PROPERTIES SKIP_RETURN_CODE 77 LABELS install TIMEOUT 300)
