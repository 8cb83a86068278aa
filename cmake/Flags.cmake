# Compiler flags. The baseline ISA is x86-64-v3 (AVX2, FMA, F16C); AVX-512 kernels live in their
# own files compiled with their own flags and are chosen at run time (never -march=native).
set(SHARDWISE_BASE_ARCH_FLAGS "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(SHARDWISE_BASE_ARCH_FLAGS -march=x86-64-v3 -mtune=generic)
  set(SHARDWISE_AVX512_FLAGS -march=x86-64-v4 -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mf16c -mfma)
  set(SHARDWISE_X86 ON)
endif()

add_library(shardwise_flags INTERFACE)
target_compile_options(shardwise_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter ${SHARDWISE_BASE_ARCH_FLAGS}>)
target_include_directories(shardwise_flags INTERFACE ${PROJECT_SOURCE_DIR})

if(SHARDWISE_SANITIZE)
  target_compile_options(shardwise_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(shardwise_flags INTERFACE -fsanitize=address,undefined)
endif()

if(SHARDWISE_PORTABLE)
  target_link_options(shardwise_flags INTERFACE -static-libstdc++ -static-libgcc)
endif()
