// hopmm._tensormap: encodes CUDA TMA descriptors (CUtensorMap) for the kernels.
//
// The driver entry point is resolved with dlopen/dlsym at run time, so the
// module builds without the CUDA toolkit and imports on machines without a GPU
// or driver (the CPU tests and kernel compilation via NVRTC need neither).
// KernelLaunch encodes the maps of every matmul call and launches the kernel
// (cuLaunchKernelEx, or cuLaunchKernel) in one call from Python, allocating nothing on the way;
// DirectRepeat runs all the launches of a repeated call in one call from Python.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// --- The subset of the driver ABI we use, spelled out instead of including
// cuda.h. Values are fixed by the ABI; tests/test_tma.py checks them against a
// cuda.h when one is installed.
using CUresult = int;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNotInitialized = 3;
constexpr CUresult kCudaErrorInvalidContext = 201;

constexpr int kTensorMapQwords = 16;  // CU_TENSOR_MAP_NUM_QWORDS
// The driver requires the map itself to be 64-byte aligned.
struct alignas(64) CUtensorMap {
    uint64_t opaque[kTensorMapQwords];
};
constexpr size_t kTensorMapBytes = sizeof(CUtensorMap);
static_assert(kTensorMapBytes == 128, "CUtensorMap is 128 bytes");

// CUtensorMapDataType (the ones hopmm uses)
constexpr int kDataTypeFloat16 = 6;
constexpr int kDataTypeFloat32 = 7;
constexpr int kDataTypeBFloat16 = 9;
// CUtensorMapInterleave
constexpr int kInterleaveNone = 0;
// CUtensorMapSwizzle
constexpr int kSwizzleNone = 0;
constexpr int kSwizzle32B = 1;
constexpr int kSwizzle64B = 2;
constexpr int kSwizzle128B = 3;
// CUtensorMapL2promotion
constexpr int kL2PromotionNone = 0;
constexpr int kL2Promotion64B = 1;
constexpr int kL2Promotion128B = 2;
constexpr int kL2Promotion256B = 3;
// CUtensorMapFloatOOBfill
constexpr int kOobFillNone = 0;
constexpr int kOobFillNanRequestZeroFma = 1;

constexpr int kMaxRank = 5;
// TMA steps through every element: no strided traversal.
constexpr uint32_t kElementStride = 1;

using EncodeTiledFn = CUresult (*)(CUtensorMap* tensor_map, int data_type, uint32_t rank,
                                   void* global_address, const uint64_t* global_dim,
                                   const uint64_t* global_strides, const uint32_t* box_dim,
                                   const uint32_t* element_strides, int interleave, int swizzle,
                                   int l2_promotion, int oob_fill);
using GetErrorFn = CUresult (*)(CUresult error, const char** text);
using LaunchKernelFn = CUresult (*)(void* function, uint32_t grid_x, uint32_t grid_y,
                                    uint32_t grid_z, uint32_t block_x, uint32_t block_y,
                                    uint32_t block_z, uint32_t shared_mem_bytes, void* stream,
                                    void** kernel_params, void** extra);

// cuLaunchKernelEx's configuration (CUlaunchConfig, CUlaunchAttribute): the two attributes
// hopmm sets, programmatic stream serialization and a cluster shape given at launch.
constexpr int kLaunchAttributeClusterDimension = 4;
constexpr int kLaunchAttributeProgrammaticStreamSerialization = 6;
constexpr size_t kLaunchAttributeValueBytes = 64;  // CUlaunchAttributeValue is a 64-byte union
struct CUlaunchAttribute {
    int id;
    char pad[8 - sizeof(int)];
    union {
        char bytes[kLaunchAttributeValueBytes];
        int programmatic_stream_serialization_allowed;
        struct {
            uint32_t x, y, z;
        } cluster_dim;
    } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
struct CUlaunchConfig {
    uint32_t grid_x, grid_y, grid_z;
    uint32_t block_x, block_y, block_z;
    uint32_t shared_mem_bytes;
    void* stream;
    CUlaunchAttribute* attrs;
    uint32_t num_attrs;
};
static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig is 56 bytes");
using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig* config, void* function,
                                      void** kernel_params, void** extra);
using OccupancyMaxActiveClustersFn = CUresult (*)(int* clusters, void* function,
                                                  const CUlaunchConfig* config);
using MemsetD2D8AsyncFn = CUresult (*)(uint64_t dst, size_t pitch, unsigned char value,
                                       size_t width, size_t height, void* stream);

const char kDriverLibrary[] = "libcuda.so.1";
const char kNoDriverMessage[] =
    "CUDA driver (libcuda.so.1) not found: tensor maps need an NVIDIA driver";

struct Driver {
    EncodeTiledFn encode_tiled = nullptr;
    GetErrorFn get_error_name = nullptr;
    LaunchKernelFn launch_kernel = nullptr;
    LaunchKernelExFn launch_kernel_ex = nullptr;  // CUDA 12.0 drivers and later
    OccupancyMaxActiveClustersFn max_active_clusters = nullptr;  // likewise
    MemsetD2D8AsyncFn memset_2d_async = nullptr;
};

Driver load_driver() {
    Driver d;
    // Never dlclose'd: the pointers stay valid for the life of the process.
    void* lib = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return d;
    d.encode_tiled = reinterpret_cast<EncodeTiledFn>(dlsym(lib, "cuTensorMapEncodeTiled"));
    d.get_error_name = reinterpret_cast<GetErrorFn>(dlsym(lib, "cuGetErrorName"));
    d.launch_kernel = reinterpret_cast<LaunchKernelFn>(dlsym(lib, "cuLaunchKernel"));
    d.launch_kernel_ex = reinterpret_cast<LaunchKernelExFn>(dlsym(lib, "cuLaunchKernelEx"));
    d.max_active_clusters = reinterpret_cast<OccupancyMaxActiveClustersFn>(
        dlsym(lib, "cuOccupancyMaxActiveClusters"));
    d.memset_2d_async = reinterpret_cast<MemsetD2D8AsyncFn>(dlsym(lib, "cuMemsetD2D8Async"));
    return d;
}

// Resolved once; C++11 makes the initialisation of a function-local static
// thread-safe, and afterwards each call is a plain load.
const Driver& driver() {
    static const Driver d = load_driver();
    return d;
}

// Fixed-size argument storage, so parsing allocates nothing.
struct TiledArgs {
    int data_type;
    uint64_t address;
    uint32_t rank;
    std::array<uint64_t, kMaxRank> dims{};
    std::array<uint64_t, kMaxRank - 1> strides{};
    std::array<uint32_t, kMaxRank> box{};
    int swizzle;
    int l2_promotion;
    int oob_fill;
};

// Copies a Python sequence of ints into out[0..n), range-checked by pybind11.
template <typename T, size_t N>
size_t read_ints(const py::sequence& seq, const char* name, std::array<T, N>& out) {
    const size_t n = seq.size();
    if (n > N) {
        throw py::value_error(std::string(name) + ": at most " + std::to_string(N) +
                              " entries, got " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
        try {
            out[i] = seq[i].cast<T>();
        } catch (const py::cast_error&) {
            throw py::value_error(std::string(name) + "[" + std::to_string(i) + "] = " +
                                  py::repr(seq[i]).cast<std::string>() +
                                  " is not an integer in the range of uint" +
                                  std::to_string(8 * sizeof(T)) + "_t");
        }
    }
    return n;
}

TiledArgs parse_args(int data_type, uint64_t address, const py::sequence& dims,
                     const py::sequence& strides_bytes, const py::sequence& box, int swizzle,
                     int l2_promotion, int oob_fill) {
    TiledArgs a;
    a.data_type = data_type;
    a.address = address;
    a.swizzle = swizzle;
    a.l2_promotion = l2_promotion;
    a.oob_fill = oob_fill;
    const size_t rank = read_ints(dims, "dims", a.dims);
    if (rank < 1) throw py::value_error("dims: rank must be 1.." + std::to_string(kMaxRank));
    a.rank = static_cast<uint32_t>(rank);
    if (read_ints(strides_bytes, "strides_bytes", a.strides) != rank - 1) {
        throw py::value_error("strides_bytes: need rank-1 = " + std::to_string(rank - 1) +
                              " entries, got " + std::to_string(strides_bytes.size()));
    }
    if (read_ints(box, "box", a.box) != rank) {
        throw py::value_error("box: need rank = " + std::to_string(rank) + " entries, got " +
                              std::to_string(box.size()));
    }
    return a;
}

// Messages are built with std::string and snprintf, not iostreams: an
// ostringstream segfaulted in this module as built on the GPU machine.
template <typename T, size_t N>
std::string list_str(const std::array<T, N>& v, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// The driver's name of a CUresult ("CUDA_ERROR_..."), or "unknown error".
const char* error_name(CUresult rc) {
    const char* name = nullptr;
    if (driver().get_error_name == nullptr ||
        driver().get_error_name(rc, &name) != kCudaSuccess || name == nullptr) {
        name = "unknown error";
    }
    return name;
}

[[noreturn]] void throw_encode_error(CUresult rc, const TiledArgs& a) {
    const char* name = error_name(rc);
    char address[32];
    std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(a.address));
    std::string msg = "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(rc) +
                      " (" + name + ")";
    if (rc == kCudaErrorNotInitialized || rc == kCudaErrorInvalidContext) {
        msg += " [the driver needs a current CUDA context: create one first, e.g. by "
               "allocating a CuPy array]";
    }
    msg += "; arguments: data_type=" + std::to_string(a.data_type) + " address=" + address +
           " rank=" + std::to_string(a.rank) + " dims=" + list_str(a.dims, a.rank) +
           " strides_bytes=" + list_str(a.strides, a.rank - 1) +
           " box=" + list_str(a.box, a.rank) +
           " element_strides=all " + std::to_string(kElementStride) +
           " interleave=" + std::to_string(kInterleaveNone) +
           " swizzle=" + std::to_string(a.swizzle) +
           " l2_promotion=" + std::to_string(a.l2_promotion) +
           " oob_fill=" + std::to_string(a.oob_fill);
    throw std::runtime_error(msg);
}

void encode(const TiledArgs& a, CUtensorMap* out) {
    const Driver& d = driver();
    if (d.encode_tiled == nullptr) throw std::runtime_error(kNoDriverMessage);
    const std::array<uint32_t, kMaxRank> element_strides{kElementStride, kElementStride,
                                                         kElementStride, kElementStride,
                                                         kElementStride};
    const CUresult rc = d.encode_tiled(out, a.data_type, a.rank,
                                       reinterpret_cast<void*>(a.address), a.dims.data(),
                                       a.strides.data(), a.box.data(), element_strides.data(),
                                       kInterleaveNone, a.swizzle, a.l2_promotion, a.oob_fill);
    if (rc != kCudaSuccess) throw_encode_error(rc, a);
}

py::bytes encode_tiled(int data_type, uint64_t address, const py::sequence& dims,
                       const py::sequence& strides_bytes, const py::sequence& box, int swizzle,
                       int l2_promotion, int oob_fill) {
    const TiledArgs a =
        parse_args(data_type, address, dims, strides_bytes, box, swizzle, l2_promotion, oob_fill);
    CUtensorMap map;
    encode(a, &map);
    return py::bytes(reinterpret_cast<const char*>(&map), kTensorMapBytes);
}

// Owns a Py_buffer for the duration of a call.
struct BufferView {
    Py_buffer view{};
    explicit BufferView(const py::handle& obj) {
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) != 0) {
            py::raise_from(PyExc_ValueError,
                           "buf must be a writable, contiguous buffer (e.g. a numpy array)");
            throw py::error_already_set();
        }
    }
    ~BufferView() { PyBuffer_Release(&view); }
    BufferView(const BufferView&) = delete;
    BufferView& operator=(const BufferView&) = delete;
};

void encode_tiled_into(const py::object& buf, Py_ssize_t offset, int data_type,
                       uint64_t address, const py::sequence& dims,
                       const py::sequence& strides_bytes, const py::sequence& box, int swizzle,
                       int l2_promotion, int oob_fill) {
    BufferView b(buf);
    const auto size = static_cast<Py_ssize_t>(kTensorMapBytes);
    if (offset < 0 || offset > b.view.len - size) {
        throw py::value_error("offset " + std::to_string(offset) + ": a " +
                              std::to_string(kTensorMapBytes) +
                              "-byte tensor map does not fit in a buffer of " +
                              std::to_string(b.view.len) + " bytes");
    }
    const TiledArgs a =
        parse_args(data_type, address, dims, strides_bytes, box, swizzle, l2_promotion, oob_fill);
    // Encode into an aligned local (the driver needs 64-byte alignment, the
    // buffer slot may not have it), then copy: the buffer is only written on success.
    CUtensorMap map;
    encode(a, &map);
    std::memcpy(static_cast<char*>(b.view.buf) + offset, &map, kTensorMapBytes);
}

// A kernel launch that repeats with new base addresses only. The tensor-map templates, the
// grid and the scalar arguments are parsed and checked once; each launch() then encodes the
// maps on its own stack and launches. The maps of the last kCachedAddresses base addresses of
// each operand are kept, so a repeat on the same arrays (weights, rotating buffers of a memory
// pool) copies its maps instead of encoding them again (encoding three maps took about 0.5 us
// of a 9 us cached call on an H100 machine's host, bench/NOTES.md v0.11). The kernel's
// parameters are the maps, in order, then `pointers` raw 64-bit device pointers (split-K's
// workspace and semaphores), then the 32-bit integers. launch() takes one base address per map
// parameter followed by the pointers. A parameter may be a group of maps laid out one after
// the other (a phased operand's eight, each at its own offset from the one base address).
// `programmatic`: launch with programmatic stream serialization (cuLaunchKernelEx), so that the
// kernel may be scheduled before the previous kernel of the stream has finished; only for
// kernels that wait (griddepcontrol.wait) before touching global memory. Drivers without
// cuLaunchKernelEx get a plain launch.
// `cluster`: the thread-block cluster shape, for kernels whose shape is chosen at launch (no
// __cluster_dims__); (1, 1, 1) launches without one. It needs cuLaunchKernelEx.
class KernelLaunch {
  public:
    // A and B (one map each, or a phased operand's eight), C, and split-K's workspace or the
    // shared-A kernel's second B and C.
    static constexpr size_t kMaxMaps = 20;
    static constexpr size_t kMaxPointers = 4;
    // The kernel's 12 integers (K, the batch mapping, the raster, the output's extent), a row
    // store's 4 and a fused epilogue's 9 (extents, strides, alpha and beta as fp32 bits), with
    // room to spare (tests/test_row_store_cpu.py counts the fullest kernel's).
    static constexpr size_t kMaxInts = 32;
    static constexpr std::array<uint32_t, 3> kNoCluster{1, 1, 1};

    KernelLaunch(uint64_t function, const py::sequence& grid, uint32_t block_x,
                 uint32_t shared_mem_bytes, const py::sequence& map_templates,
                 const py::sequence& ints, size_t pointers, bool programmatic,
                 const py::sequence& cluster)
        : function_(reinterpret_cast<void*>(function)), block_x_(block_x),
          shared_mem_(shared_mem_bytes), n_ptrs_(pointers), programmatic_(programmatic) {
        if (n_ptrs_ > kMaxPointers) throw py::value_error("at most 4 pointer arguments");
        if (read_ints(grid, "grid", grid_) != grid_.size()) throw py::value_error("grid: 3 ints");
        if (read_ints(cluster, "cluster", cluster_) != cluster_.size()) {
            throw py::value_error("cluster: 3 ints");
        }
        for (size_t i = 0; i < cluster_.size(); ++i) {
            if (cluster_[i] == 0 || grid_[i] % cluster_[i] != 0) {
                throw py::value_error("cluster " + list_str(cluster_, 3) +
                                      ": each extent must be positive and divide the grid's " +
                                      list_str(grid_, 3));
            }
        }
        n_params_ = map_templates.size();
        if (n_params_ > kMaxMaps) {   // (each holds a map at least; add_map_slot bounds them)
            throw py::value_error("at most " + std::to_string(kMaxMaps) + " tensor maps");
        }
        for (size_t g = 0; g < n_params_; ++g) {
            param_first_[g] = n_maps_;
            // None: the parameter carries only the base address, in its first 8 bytes (an
            // output a kernel stores without TMA, launch.ADDRESS_SLOT).
            if (map_templates[g].is_none()) {
                add_map_slot();
                address_only_[n_maps_ - 1] = true;
                continue;
            }
            // A list of (byte offset, template): consecutive maps of one parameter (a phased
            // operand's PhasedTensorMaps), each at its offset from the one base address it is given.
            if (py::isinstance<py::list>(map_templates[g])) {
                const py::list group = map_templates[g].cast<py::list>();
                if (group.size() == 0) throw py::value_error("an empty group of map templates");
                for (const py::handle item : group) {
                    const py::sequence pair = item.cast<py::sequence>();
                    if (pair.size() != 2) {
                        throw py::value_error("a grouped map is (byte offset, template)");
                    }
                    add_map_slot();
                    offsets_[n_maps_ - 1] = pair[0].cast<uint64_t>();
                    templates_[n_maps_ - 1] = parse_template(pair[1]);
                }
                continue;
            }
            add_map_slot();
            templates_[n_maps_ - 1] = parse_template(map_templates[g]);
        }
        n_ints_ = read_ints(ints, "ints", ints_);
    }

    // Map parameters: each takes one base address at launch.
    size_t maps() const { return n_params_; }
    size_t pointers() const { return n_ptrs_; }

    // launch() as Python calls it: the addresses as positional ints.
    void launch_py(uint64_t stream, const py::args& addresses) const {
        check_address_count(addresses.size());
        uint64_t values[kMaxMaps + kMaxPointers];
        for (size_t i = 0; i < addresses.size(); ++i) values[i] = addresses[i].cast<uint64_t>();
        launch_raw(stream, values, addresses.size());
    }

    // One base address per map, then the pointers: addresses[0..n).
    void launch_raw(uint64_t stream, const uint64_t* addresses, size_t n) const {
        check_address_count(n);
        const Driver& d = driver();
        if (d.launch_kernel == nullptr) throw std::runtime_error(kNoDriverMessage);
        CUtensorMap maps[kMaxMaps];
        void* params[kMaxMaps + kMaxPointers + kMaxInts];
        for (size_t g = 0; g < n_params_; ++g) {
            const size_t end = g + 1 < n_params_ ? param_first_[g + 1] : n_maps_;
            for (size_t i = param_first_[g]; i < end; ++i)
                map_at(i, addresses[g] + offsets_[i], &maps[i]);
            params[g] = &maps[param_first_[g]];
        }
        uint64_t ptrs[kMaxPointers];
        for (size_t i = 0; i < n_ptrs_; ++i) {
            ptrs[i] = addresses[n_params_ + i];
            params[n_params_ + i] = &ptrs[i];
        }
        int32_t ints[kMaxInts];
        for (size_t i = 0; i < n_ints_; ++i) {
            ints[i] = ints_[i];
            params[n_params_ + n_ptrs_ + i] = &ints[i];
        }
        void* const stream_handle = reinterpret_cast<void*>(stream);
        const bool clustered = cluster_ != kNoCluster;
        const bool ex = (programmatic_ || clustered) && d.launch_kernel_ex != nullptr;
        if (clustered && !ex) {
            throw std::runtime_error("a cluster shape given at launch needs cuLaunchKernelEx "
                                     "(a CUDA 12.0 driver or later)");
        }
        CUresult rc;
        if (ex) {
            CUlaunchAttribute attrs[2]{};
            uint32_t n_attrs = 0;
            if (programmatic_) {
                attrs[n_attrs].id = kLaunchAttributeProgrammaticStreamSerialization;
                attrs[n_attrs++].value.programmatic_stream_serialization_allowed = 1;
            }
            if (clustered) {
                attrs[n_attrs].id = kLaunchAttributeClusterDimension;
                attrs[n_attrs++].value.cluster_dim = {cluster_[0], cluster_[1], cluster_[2]};
            }
            const CUlaunchConfig config{grid_[0], grid_[1], grid_[2], block_x_, 1, 1,
                                        shared_mem_, stream_handle, attrs, n_attrs};
            rc = d.launch_kernel_ex(&config, function_, params, nullptr);
        } else {
            rc = d.launch_kernel(function_, grid_[0], grid_[1], grid_[2], block_x_, 1, 1,
                                 shared_mem_, stream_handle, params, nullptr);
        }
        if (rc != kCudaSuccess) {
            throw std::runtime_error(std::string(ex ? "cuLaunchKernelEx" : "cuLaunchKernel") +
                                     " failed with CUresult " + std::to_string(rc) + " (" +
                                     error_name(rc) + ")");
        }
    }

  private:
    void check_address_count(size_t n) const {
        if (n != n_params_ + n_ptrs_) {
            throw py::value_error("launch: one base address per tensor map, then " +
                                  std::to_string(n_ptrs_) + " pointer arguments");
        }
    }

    // (data_type, dims, strides_bytes, box, swizzle, l2_promotion, oob_fill)
    static TiledArgs parse_template(const py::handle& item) {
        const py::sequence t = item.cast<py::sequence>();
        if (t.size() != 7) throw py::value_error("a map template has 7 fields");
        return parse_args(t[0].cast<int>(), 0, t[1].cast<py::sequence>(),
                          t[2].cast<py::sequence>(), t[3].cast<py::sequence>(),
                          t[4].cast<int>(), t[5].cast<int>(), t[6].cast<int>());
    }

    void add_map_slot() {
        if (++n_maps_ > kMaxMaps) {
            throw py::value_error("at most " + std::to_string(kMaxMaps) + " tensor maps");
        }
    }

    static constexpr size_t kCachedAddresses = 4;
    struct CachedMap {
        bool valid = false;
        uint64_t address = 0;
        unsigned char bytes[kTensorMapBytes];
    };

    // Map i of base address `address` into *out: from the cache, or encoded and cached (the
    // oldest entry replaced). Every launch runs holding the GIL (pybind11 keeps it through the
    // calls from Python), which serialises every access to the cache.
    void map_at(size_t i, uint64_t address, CUtensorMap* out) const {
        if (address_only_[i]) {
            std::memset(out, 0, kTensorMapBytes);
            std::memcpy(out, &address, sizeof(address));
            return;
        }
        for (const CachedMap& c : cache_[i]) {
            if (c.valid && c.address == address) {
                std::memcpy(out, c.bytes, kTensorMapBytes);
                return;
            }
        }
        TiledArgs a = templates_[i];
        a.address = address;
        encode(a, out);  // throws before anything is cached
        CachedMap& slot = cache_[i][next_slot_[i]];
        next_slot_[i] = (next_slot_[i] + 1) % kCachedAddresses;
        std::memcpy(slot.bytes, out, kTensorMapBytes);
        slot.address = address;
        slot.valid = true;
    }

    void* function_;
    std::array<uint32_t, 3> grid_{};
    std::array<uint32_t, 3> cluster_{};
    uint32_t block_x_;
    uint32_t shared_mem_;
    size_t n_ptrs_;
    bool programmatic_;
    size_t n_maps_ = 0;     // maps, counting each of a group
    size_t n_params_ = 0;   // map parameters: a group is one
    std::array<size_t, kMaxMaps> param_first_{};   // each parameter's first map
    std::array<uint64_t, kMaxMaps> offsets_{};     // each map's offset from its base address
    std::array<TiledArgs, kMaxMaps> templates_{};
    std::array<bool, kMaxMaps> address_only_{};
    size_t n_ints_ = 0;
    std::array<int32_t, kMaxInts> ints_{};
    mutable std::array<std::array<CachedMap, kCachedAddresses>, kMaxMaps> cache_{};
    mutable std::array<size_t, kMaxMaps> next_slot_{};
};

// Clusters of `cluster_size` CTAs (shaped 1 x cluster_size x 1, as the split-K clusters are)
// of `function` that the device holds at once: cuOccupancyMaxActiveClusters. Clusters are
// placed whole inside one GPC, so on a GPU whose GPCs hold different numbers of SMs this is
// not sm_count / cluster_size.
int max_active_clusters(uint64_t function, uint32_t block_x, uint32_t shared_mem_bytes,
                        uint32_t cluster_size) {
    const Driver& d = driver();
    if (d.max_active_clusters == nullptr) throw std::runtime_error(kNoDriverMessage);
    if (cluster_size == 0) throw py::value_error("cluster_size must be positive");
    CUlaunchAttribute attr{};
    attr.id = kLaunchAttributeClusterDimension;
    attr.value.cluster_dim = {1, cluster_size, 1};
    const CUlaunchConfig config{1, cluster_size, 1, block_x, 1, 1, shared_mem_bytes, nullptr,
                                &attr, 1};
    int clusters = 0;
    const CUresult rc =
        d.max_active_clusters(&clusters, reinterpret_cast<void*>(function), &config);
    if (rc != kCudaSuccess) {
        throw std::runtime_error("cuOccupancyMaxActiveClusters failed with CUresult " +
                                 std::to_string(rc) + " (" + error_name(rc) + ")");
    }
    return clusters;
}

// Zeroes `width` bytes at the start of each of `rows` rows, `pitch` bytes apart, from `address`,
// on `stream` (cuMemsetD2D8Async): one driver call, where CuPy would launch a strided kernel.
void zero_rows(uint64_t address, size_t pitch, size_t width, size_t rows, uint64_t stream) {
    const Driver& d = driver();
    if (d.memset_2d_async == nullptr) throw std::runtime_error(kNoDriverMessage);
    if (width == 0 || rows == 0) return;
    const CUresult rc = d.memset_2d_async(address, pitch, 0, width, rows,
                                          reinterpret_cast<void*>(stream));
    if (rc != kCudaSuccess) {
        throw std::runtime_error("cuMemsetD2D8Async failed with CUresult " + std::to_string(rc) +
                                 " (" + error_name(rc) + ")");
    }
}

// Byte bounds [lo, hi) of an array relative to its base pointer (negative strides give lo < 0).
using RelativeBounds = std::pair<int64_t, int64_t>;

// The launches of a remembered call that reads A and B where the caller's arrays lie and stores
// straight into the result: no aligned copies, no split-K workspace, so nothing but the base
// addresses changes from one repeat to the next. A cached call spent 2-3 us of host time (an
// H100 machine's host, measured) in the Python around its launches: the check that out overlaps
// neither operand, the loop over the launches and their calls into this module. run() does that
// work in one call; run_fused() too for a fused epilogue's launches, which also take the bias
// and c pointers. The bounds are fixed by the shapes and strides, which the recipe's key holds.
class DirectRepeat {
  public:
    static constexpr size_t kAddresses = 3;          // the maps of A, B and C, in that order
    static constexpr size_t kEpilogueOperands = 2;   // a fused epilogue's bias and c, after them

    // `epilogue_bounds`: none for plain launches; for fused ones, bias's and c's bounds, None
    // for one the kernel does not read (its address then goes as 0). `out_may_be`: the index
    // of the epilogue operand out may be exactly (c of out's own layout: each CTA reads its
    // tile's c before storing it), or -1.
    DirectRepeat(const py::sequence& launches, const RelativeBounds& a_bounds,
                 const RelativeBounds& b_bounds, const std::optional<RelativeBounds>& out_bounds,
                 const std::vector<std::optional<RelativeBounds>>& epilogue_bounds,
                 int out_may_be)
        : a_(checked(a_bounds, "a_bounds")), b_(checked(b_bounds, "b_bounds")),
          out_may_be_(out_may_be) {
        if (out_bounds) out_ = checked(*out_bounds, "out_bounds");
        if (!epilogue_bounds.empty() && epilogue_bounds.size() != kEpilogueOperands) {
            throw py::value_error("DirectRepeat: epilogue_bounds holds bias's and c's, got " +
                                  std::to_string(epilogue_bounds.size()));
        }
        for (const auto& bounds : epilogue_bounds) {
            epilogue_.push_back(bounds ? std::optional<RelativeBounds>(
                                             checked(*bounds, "epilogue_bounds"))
                                       : std::nullopt);
        }
        if (out_may_be < -1 || out_may_be >= static_cast<int>(epilogue_.size())) {
            throw py::value_error("DirectRepeat: out_may_be = " + std::to_string(out_may_be) +
                                  " names no epilogue operand");
        }
        const size_t addresses = kAddresses + epilogue_.size();
        if (launches.size() == 0) throw py::value_error("DirectRepeat: no launches");
        for (const py::handle item : launches) {
            if (!py::isinstance<KernelLaunch>(item)) {
                throw py::type_error("DirectRepeat: launches must be KernelLaunch objects, got " +
                                     py::repr(item).cast<std::string>());
            }
            const auto* launch = item.cast<const KernelLaunch*>();
            if (launch->maps() < kAddresses ||
                launch->maps() + launch->pointers() != addresses) {
                throw py::value_error(
                    "DirectRepeat: each launch must take the maps of A, B and C" +
                    std::string(epilogue_.empty() ? " only" : ", then bias and c") +
                    ", got one of " + std::to_string(launch->maps()) + " maps and " +
                    std::to_string(launch->pointers()) + " pointers");
            }
            owners_.push_back(py::reinterpret_borrow<py::object>(item));
            launches_.push_back(launch);
        }
    }

    // False, launching nothing, where out's bytes intersect A's or B's (the caller then takes
    // the full path); else every launch in order on `stream`, and True.
    bool run(uint64_t stream, uint64_t a_ptr, uint64_t b_ptr, uint64_t c_ptr) const {
        if (!epilogue_.empty()) {
            throw py::value_error("DirectRepeat: fused launches take bias and c: run_fused()");
        }
        if (out_ && out_overlaps_operands(c_ptr, a_ptr, b_ptr)) return false;
        const uint64_t addresses[kAddresses] = {a_ptr, b_ptr, c_ptr};
        launch_all(stream, addresses, kAddresses);
        return true;
    }

    // run() of fused launches: also False where out's bytes intersect bias's or c's (other than
    // out being the operand out_may_be names, at the same address).
    bool run_fused(uint64_t stream, uint64_t a_ptr, uint64_t b_ptr, uint64_t c_ptr,
                   uint64_t bias_ptr, uint64_t c_in_ptr) const {
        if (epilogue_.empty()) {
            throw py::value_error("DirectRepeat: plain launches take no bias or c: run()");
        }
        const uint64_t given[kEpilogueOperands] = {bias_ptr, c_in_ptr};
        uint64_t addresses[kAddresses + kEpilogueOperands] = {a_ptr, b_ptr, c_ptr};
        for (size_t i = 0; i < kEpilogueOperands; ++i) {
            addresses[kAddresses + i] = epilogue_[i] ? given[i] : 0;
        }
        if (out_) {
            if (out_overlaps_operands(c_ptr, a_ptr, b_ptr)) return false;
            const Span out = span(c_ptr, *out_);
            for (size_t i = 0; i < kEpilogueOperands; ++i) {
                if (!epilogue_[i]) continue;
                if (static_cast<int>(i) == out_may_be_ && given[i] == c_ptr) continue;
                if (overlaps(out, span(given[i], *epilogue_[i]))) return false;
            }
        }
        launch_all(stream, addresses, kAddresses + kEpilogueOperands);
        return true;
    }

    py::tuple launches() const {
        py::tuple t(owners_.size());
        for (size_t i = 0; i < owners_.size(); ++i) t[i] = owners_[i];
        return t;
    }

  private:
    // Absolute byte bounds: 128-bit, so a 64-bit address plus a 64-bit offset is exact.
    struct Span {
        __int128 lo, hi;
    };

    static Span span(uint64_t base, const RelativeBounds& b) {
        return {static_cast<__int128>(base) + b.first, static_cast<__int128>(base) + b.second};
    }

    // Half-open intersection, the rule of layout.overlaps.
    static bool overlaps(const Span& x, const Span& y) { return x.lo < y.hi && y.lo < x.hi; }

    static RelativeBounds checked(const RelativeBounds& b, const char* name) {
        if (b.first > b.second) {
            throw py::value_error(std::string("DirectRepeat: ") + name + " = (" +
                                  std::to_string(b.first) + ", " + std::to_string(b.second) +
                                  ") has lo > hi");
        }
        return b;
    }

    bool out_overlaps_operands(uint64_t c_ptr, uint64_t a_ptr, uint64_t b_ptr) const {
        const Span c = span(c_ptr, *out_);
        return overlaps(c, span(a_ptr, a_)) || overlaps(c, span(b_ptr, b_));
    }

    void launch_all(uint64_t stream, const uint64_t* addresses, size_t n) const {
        for (const KernelLaunch* launch : launches_) launch->launch_raw(stream, addresses, n);
    }

    RelativeBounds a_, b_;
    std::optional<RelativeBounds> out_;
    std::vector<std::optional<RelativeBounds>> epilogue_;
    int out_may_be_;
    std::vector<py::object> owners_;  // keep the launches alive
    std::vector<const KernelLaunch*> launches_;
};

}  // namespace

PYBIND11_MODULE(_tensormap, m) {
    m.doc() = "Encodes CUDA TMA tensor maps (CUtensorMap) via the driver loaded at run time.";

    m.def("driver_available", [] { return driver().encode_tiled != nullptr; },
          "True if libcuda.so.1 loads and provides cuTensorMapEncodeTiled.");
    m.def("encode_tiled", &encode_tiled, py::arg("data_type"), py::arg("address"),
          py::arg("dims"), py::arg("strides_bytes"), py::arg("box"), py::arg("swizzle"),
          py::arg("l2_promotion"), py::arg("oob_fill"),
          "Returns the 128-byte CUtensorMap from cuTensorMapEncodeTiled (dims innermost "
          "first; element strides 1; no interleave).");
    m.def("encode_tiled_into", &encode_tiled_into, py::arg("buf"), py::arg("offset"),
          py::arg("data_type"), py::arg("address"), py::arg("dims"), py::arg("strides_bytes"),
          py::arg("box"), py::arg("swizzle"), py::arg("l2_promotion"), py::arg("oob_fill"),
          "Like encode_tiled, but writes the 128 bytes into buf at byte offset.");

    // Exported so the tests can check them against tma.py and cuda.h.
    m.attr("TENSOR_MAP_BYTES") = kTensorMapBytes;
    m.attr("MAX_RANK") = kMaxRank;
    m.attr("CUDA_SUCCESS") = kCudaSuccess;
    m.attr("CUDA_ERROR_NOT_INITIALIZED") = kCudaErrorNotInitialized;
    m.attr("CUDA_ERROR_INVALID_CONTEXT") = kCudaErrorInvalidContext;
    m.def("max_active_clusters", &max_active_clusters, py::arg("function"), py::arg("block_x"),
          py::arg("shared_mem_bytes"), py::arg("cluster_size"),
          "cuOccupancyMaxActiveClusters: how many clusters of cluster_size CTAs of the kernel "
          "(block_x threads, shared_mem_bytes of dynamic shared memory) the device runs at "
          "once.");
    m.def("zero_rows", &zero_rows, py::arg("address"), py::arg("pitch"), py::arg("width"),
          py::arg("rows"), py::arg("stream"),
          "cuMemsetD2D8Async: zeroes width bytes at the start of each of rows rows, pitch "
          "bytes apart, from address, on stream.");
    m.attr("LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION") = kLaunchAttributeClusterDimension;
    m.attr("LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION") =
        kLaunchAttributeProgrammaticStreamSerialization;
    m.attr("DATA_TYPE_FLOAT16") = kDataTypeFloat16;
    m.attr("DATA_TYPE_FLOAT32") = kDataTypeFloat32;
    m.attr("DATA_TYPE_BFLOAT16") = kDataTypeBFloat16;
    m.attr("INTERLEAVE_NONE") = kInterleaveNone;
    m.attr("SWIZZLE_NONE") = kSwizzleNone;
    m.attr("SWIZZLE_32B") = kSwizzle32B;
    m.attr("SWIZZLE_64B") = kSwizzle64B;
    m.attr("SWIZZLE_128B") = kSwizzle128B;
    m.attr("L2_PROMOTION_NONE") = kL2PromotionNone;
    m.attr("L2_PROMOTION_64B") = kL2Promotion64B;
    m.attr("L2_PROMOTION_128B") = kL2Promotion128B;
    m.attr("L2_PROMOTION_256B") = kL2Promotion256B;
    m.attr("OOB_FILL_NONE") = kOobFillNone;
    m.attr("OOB_FILL_NAN_REQUEST_ZERO_FMA") = kOobFillNanRequestZeroFma;
    py::class_<KernelLaunch>(m, "KernelLaunch",
                             "A repeatable launch: tensor-map templates + grid + scalar args.")
        .def(py::init<uint64_t, const py::sequence&, uint32_t, uint32_t, const py::sequence&,
                      const py::sequence&, size_t, bool, const py::sequence&>(),
             py::arg("function"), py::arg("grid"), py::arg("block_x"),
             py::arg("shared_mem_bytes"), py::arg("map_templates"), py::arg("ints"),
             py::arg("pointers") = 0, py::arg("programmatic") = false,
             py::arg("cluster") = py::make_tuple(1, 1, 1))
        .def("launch", &KernelLaunch::launch_py, py::arg("stream"));
    py::class_<DirectRepeat>(m, "DirectRepeat",
                             "The launches of a call that reads A and B in place and stores "
                             "straight into C, repeated on new base addresses.")
        .def(py::init<const py::sequence&, const RelativeBounds&, const RelativeBounds&,
                      const std::optional<RelativeBounds>&,
                      const std::vector<std::optional<RelativeBounds>>&, int>(),
             py::arg("launches"), py::arg("a_bounds"), py::arg("b_bounds"),
             py::arg("out_bounds"),
             py::arg("epilogue_bounds") = std::vector<std::optional<RelativeBounds>>{},
             py::arg("out_may_be") = -1)
        .def("run", &DirectRepeat::run, py::arg("stream"), py::arg("a_ptr"), py::arg("b_ptr"),
             py::arg("c_ptr"),
             "Launches on (a_ptr, b_ptr, c_ptr) and returns True; returns False, launching "
             "nothing, where out's bounds at c_ptr intersect A's or B's.")
        .def("run_fused", &DirectRepeat::run_fused, py::arg("stream"), py::arg("a_ptr"),
             py::arg("b_ptr"), py::arg("c_ptr"), py::arg("bias_ptr"), py::arg("c_in_ptr"),
             "run() of fused launches, which also take bias's and c's addresses (0 for one "
             "not read); also False where out's bounds intersect bias's or c's, out being c "
             "itself excepted.")
        .def_property_readonly("launches", &DirectRepeat::launches);
}
