#pragma once
/// \file strata/config.hpp
/// The one place where the backends are chosen (OpenMP, BLAS, CUDA and its Thrust).
///
/// - Host work runs as OpenMP loops when the translation unit is compiled with OpenMP
///   (`-fopenmp`), otherwise as serial loops (place/algorithm.hpp); it includes no Thrust.
/// - CUDA (`place::Cuda`) exists only in translation units that nvcc compiles (`__CUDACC__`);
///   its ops run on Thrust's CUDA system.
/// - The host BLAS is reached through CBLAS. `STRATA_BLAS_OPENBLAS` (set by the Meson build when
///   the BLAS is OpenBLAS) lets strata set OpenBLAS's thread count; any CBLAS works without it.

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#define STRATA_HAS_CUDA 1
#else
#define STRATA_HD
#define STRATA_HAS_CUDA 0
#endif

#if defined(_OPENMP)
#define STRATA_HAS_OPENMP 1
#else
#define STRATA_HAS_OPENMP 0
#endif

#if defined(__GNUC__)
#define STRATA_INLINE inline __attribute__((always_inline))
#else
#define STRATA_INLINE inline
#endif

// Header-only (the default), or with the compiled part. With STRATA_SEPARATE_COMPILATION defined
// in every translation unit of a program (the `strata-compiled` Meson and pkg-config
// dependencies define it), the headers declare strata's non-template code and the library
// (src/strata.cpp, libstrata) defines it, compiled once: the way fmt and Asio offer one. A header
// with such code declares it STRATA_DECL (`inline` when header-only) and ends with
// `#if STRATA_DEFINITIONS #include ".../impl/X.ipp"`: the definitions are compiled in every unit
// when header-only, and only in src/strata.cpp, which defines STRATA_BUILDING_COMPILED_PART,
// with the compiled part. The compiled part also holds the common instantiations of templates
// (float and double, the host place): each header lists its own once, in a block
// `#if STRATA_INSTANCES ... STRATA_TEMPLATE ...`, which is their `extern template` declarations
// in a program's units and their definitions (`template`) in src/strata.cpp, so that a
// declaration without its definition cannot be written.
#if defined(STRATA_SEPARATE_COMPILATION)
#define STRATA_HEADER_ONLY 0
#define STRATA_DECL
#else
#define STRATA_HEADER_ONLY 1
#define STRATA_DECL inline
#endif
#if defined(STRATA_BUILDING_COMPILED_PART)
#if !defined(STRATA_SEPARATE_COMPILATION)
#error "STRATA_BUILDING_COMPILED_PART: src/strata.cpp is compiled with STRATA_SEPARATE_COMPILATION"
#endif
#define STRATA_DEFINITIONS 1
#define STRATA_INSTANCES 1
#define STRATA_TEMPLATE template
#elif STRATA_HEADER_ONLY
#define STRATA_DEFINITIONS 1
#define STRATA_INSTANCES 0
#else
#define STRATA_DEFINITIONS 0
#define STRATA_INSTANCES 1
#define STRATA_TEMPLATE extern template
#endif

// The MPI code's compiled part, a second switch beside the first. libstrata is built without
// MPI, so the non-template code of the MPI headers (collective/process_group.hpp, mailbox.hpp,
// pipeline_mpi.hpp, parameter_server_mpi.hpp, multi_worker_mirrored.hpp) stays inline in every
// unit that includes them unless STRATA_SEPARATE_COMPILATION_MPI is defined too (the
// `strata-mpi-compiled` Meson and pkg-config dependencies define both macros): then
// libstrata_mpi (src/strata_mpi.cpp, which defines STRATA_BUILDING_MPI_PART) defines it, and
// ProcessGroup's all_reduce and broadcast for float and double. The same scheme as the first,
// with its own names: STRATA_MPI_DECL, `#if STRATA_MPI_DEFINITIONS #include ".../impl/X.ipp"`,
// and a block `#if STRATA_MPI_INSTANCES ... STRATA_MPI_TEMPLATE ...`. A program that links
// libstrata alone keeps the MPI code inline; libstrata_mpi is built on libstrata, so its macro
// needs STRATA_SEPARATE_COMPILATION.
#if defined(STRATA_SEPARATE_COMPILATION_MPI)
#if !defined(STRATA_SEPARATE_COMPILATION)
#error "STRATA_SEPARATE_COMPILATION_MPI needs STRATA_SEPARATE_COMPILATION too (libstrata_mpi is built on libstrata)"
#endif
#define STRATA_MPI_HEADER_ONLY 0
#define STRATA_MPI_DECL
#else
#define STRATA_MPI_HEADER_ONLY 1
#define STRATA_MPI_DECL inline
#endif
#if defined(STRATA_BUILDING_MPI_PART)
#if !defined(STRATA_SEPARATE_COMPILATION_MPI) || defined(STRATA_BUILDING_COMPILED_PART)
#error "STRATA_BUILDING_MPI_PART: src/strata_mpi.cpp is compiled with STRATA_SEPARATE_COMPILATION and STRATA_SEPARATE_COMPILATION_MPI, apart from src/strata.cpp"
#endif
#define STRATA_MPI_DEFINITIONS 1
#define STRATA_MPI_INSTANCES 1
#define STRATA_MPI_TEMPLATE template
#elif STRATA_MPI_HEADER_ONLY
#define STRATA_MPI_DEFINITIONS 1
#define STRATA_MPI_INSTANCES 0
#else
#define STRATA_MPI_DEFINITIONS 0
#define STRATA_MPI_INSTANCES 1
#define STRATA_MPI_TEMPLATE extern template
#endif

// The CUDA place's compiled part, a third switch. An nvcc unit otherwise compiles the kernels of
// every op it uses on place::Cuda, including those that do not depend on the network (the
// losses, metrics, initializers, activations, reductions, softmax, optimizer states, Tensor's
// storage), for float and double: most of a CUDA model unit's kernels. With
// STRATA_SEPARATE_COMPILATION_CUDA defined too (the `strata-cuda-compiled` Meson dependency
// defines it with STRATA_SEPARATE_COMPILATION, which it needs), the headers declare those
// instantiations `extern template` in nvcc units and libstrata_cuda
// (src/strata_cuda.cu, compiled once by nvcc with the build's CUDA flags) defines them. Units
// g++ compiles never instantiate CUDA code, so the macro changes nothing in them.
#if defined(STRATA_SEPARATE_COMPILATION_CUDA) && !defined(STRATA_SEPARATE_COMPILATION)
#error "STRATA_SEPARATE_COMPILATION_CUDA needs STRATA_SEPARATE_COMPILATION too (libstrata_cuda is built on libstrata)"
#endif
// Each such header ends with a block `#if STRATA_CUDA_INSTANCES ... STRATA_CUDA_TEMPLATE ...`
// listing them once: `extern template` in those units, and `template` (the definitions) in
// src/strata_cuda.cu, which defines STRATA_BUILDING_CUDA_PART before including the headers.
#if defined(STRATA_BUILDING_CUDA_PART)
#if !defined(__CUDACC__) || !defined(STRATA_SEPARATE_COMPILATION)
#error "STRATA_BUILDING_CUDA_PART: src/strata_cuda.cu is compiled by nvcc with STRATA_SEPARATE_COMPILATION"
#endif
#define STRATA_CUDA_INSTANCES 1
#define STRATA_CUDA_TEMPLATE template
#elif defined(STRATA_SEPARATE_COMPILATION_CUDA) && defined(__CUDACC__)
#define STRATA_CUDA_INSTANCES 1
#define STRATA_CUDA_TEMPLATE extern template
#else
#define STRATA_CUDA_INSTANCES 0
#endif

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0
