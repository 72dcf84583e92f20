# CMake toolchain file for Horovod's compile (CMAKE_TOOLCHAIN_FILE in the environment: CMake >= 3.21).
# Horovod's setup.py always builds RelWithDebInfo, "-O2 -g -DNDEBUG", which its CMakeLists.txt turns
# into -O3. The same optimisation without -g: the same machine code (the .text section of Horovod
# 0.28.1's TensorFlow library is byte for byte the one a -g build makes), a compile about a fifth
# shorter and a wheel of 1.1 MB instead of 17.5 (measured side by side on two cores, twice each:
# 184 and 194 s against 242 and 242). Set as cache entries before the compiler modules would set
# theirs, so that theirs do not replace them.
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "RelWithDebInfo without -g")
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "RelWithDebInfo without -g")
set(CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "RelWithDebInfo without -g")
