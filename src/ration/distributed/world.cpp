// world.cpp — rendezvous from the environment, the c10d process group, blocking collective helpers.
// Owns: parsing and checking RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / RATION_STORE_FILE,
//       store and process-group construction, and turning c10d failures into ration::Error.
#define USE_C10D_GLOO 1
#include "ration/distributed/world.h"

#include <algorithm>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

#include "ration/base/check.h"
#include "ration/base/net.h"

#ifdef RATION_CUDA
#define USE_C10D_NCCL 1
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ration::dist {

struct World::State {
  int rank = 0;
  int size = 1;
  Backend backend = Backend::Gloo;
  at::Device device = at::kCPU;
  c10::intrusive_ptr<c10d::Store> store;          // null for init_single
  c10::intrusive_ptr<Collectives> group;          // null for init_single
  std::chrono::milliseconds timeout{0};           // of rendezvous and every collective (open_channel reuses it)
  std::shared_ptr<::gloo::transport::Device> gloo_device;  // Gloo: the device the group binds (open_channel too)
  int channels_opened = 0;  // open_channel calls so far: each channel's store keys are its own
  std::map<std::string, int> subgroups_opened;  // subgroup calls so far, per name (members only call them)
  std::mutex replica_mu;
  std::weak_ptr<ReplicaGroup> replica_group;      // weak: the group holds a World (no cycle)
};

namespace {

using Env = std::map<std::string, std::string>;

const char* const kEnvHelp =
    " (set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun does, or RANK, WORLD_SIZE and "
    "RATION_STORE_FILE=/shared/path; for one process leave WORLD_SIZE unset, or call World::init_single() from C++)";

std::optional<std::string> lookup(const Env& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

std::string require(const Env& env, const std::string& name, const std::string& expected) {
  auto v = lookup(env, name);
  RATION_CHECK(v.has_value(), "distributed init: environment variable ", name, " is not set; expected ", expected,
               kEnvHelp);
  RATION_CHECK(!v->empty(), "distributed init: environment variable ", name, " is empty; expected ", expected,
               kEnvHelp);
  return *v;
}

// A whole-string decimal integer in [lo, hi]; anything else names the variable and the expected form.
int64_t parse_int(const std::string& name, const std::string& text, int64_t lo, int64_t hi,
                  const std::string& expected) {
  bool ok = !text.empty() && text.size() <= 18;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  const int64_t value = ok ? std::stoll(text) : 0;
  RATION_CHECK(ok && value >= lo && value <= hi, "distributed init: ", name, "='", text, "' is not valid; expected ",
               expected, kEnvHelp);
  return value;
}

// Runs one c10d call and waits for it; c10d/Gloo failures become ration::Error naming the collective.
template <typename Fn>
void run_collective(const char* what, int rank, int size, Fn&& fn) {
  try {
    c10::intrusive_ptr<c10d::Work> work = fn();
    work->wait();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(detail::str("collective ", what, " failed on rank ", rank, " of ", size, ": ", e.what(),
                                      " (every rank must call the same collectives in the same order with tensors "
                                      "of the same shape and dtype; a rank that exited or timed out also shows up "
                                      "here)"));
  }
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const Env& env, const std::optional<std::string>& master) {
  if (auto ifname = lookup(env, "GLOO_SOCKET_IFNAME"); ifname && !ifname->empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  }
  // All ranks on this host through loopback: bind loopback explicitly rather than trusting that the
  // host name resolves to a reachable address (it often does not in containers).
  if (master && is_loopback_host(*master)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

const char* to_string(Backend b) { return b == Backend::Gloo ? "gloo" : "nccl"; }

World World::init(const WorldOptions& options) {
  static const char* const kNames[] = {"RANK",          "WORLD_SIZE",          "MASTER_ADDR",
                                       "MASTER_PORT",   "RATION_STORE_FILE",   "RATION_DIST_BACKEND",
                                       "RATION_DIST_TIMEOUT_S", "GLOO_SOCKET_IFNAME", "LOCAL_RANK"};
  Env env;
  for (const char* name : kNames) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return init_from(env, options);
}

World World::init_from(const Env& env, const WorldOptions& options) {
  // A write to a peer that died must fail with EPIPE, not kill this rank with SIGPIPE (Gloo's TCP pairs
  // write without MSG_NOSIGNAL): a survivor has to live long enough to name the lost rank and leave its
  // note, or the other survivors take it for lost too.
  std::signal(SIGPIPE, SIG_IGN);
  auto state = std::make_shared<State>();
  const int64_t size = parse_int("WORLD_SIZE", require(env, "WORLD_SIZE", "an integer >= 1"), 1,
                                 std::numeric_limits<int>::max(), "an integer >= 1");
  const std::string rank_form = "an integer in [0, WORLD_SIZE) = [0, " + std::to_string(size) + ")";
  const int64_t rank = parse_int("RANK", require(env, "RANK", rank_form), 0, size - 1, rank_form);
  state->rank = static_cast<int>(rank);
  state->size = static_cast<int>(size);

  std::chrono::milliseconds timeout = options.timeout;
  if (auto t = lookup(env, "RATION_DIST_TIMEOUT_S")) {
    timeout = std::chrono::seconds(
        parse_int("RATION_DIST_TIMEOUT_S", *t, 1, 7 * 24 * 3600, "a whole number of seconds >= 1"));
  }
  const std::string backend_name = lookup(env, "RATION_DIST_BACKEND").value_or("gloo");
  RATION_CHECK(backend_name == "gloo" || backend_name == "nccl", "distributed init: RATION_DIST_BACKEND='",
               backend_name, "' is not valid; expected gloo or nccl");
  state->backend = backend_name == "gloo" ? Backend::Gloo : Backend::Nccl;
#ifndef RATION_CUDA
  RATION_CHECK(state->backend == Backend::Gloo,
               "distributed init: RATION_DIST_BACKEND=nccl needs a build with -DRATION_CUDA=ON; use gloo for CPU");
#endif

  // Store: a shared file, or a TCP server on rank 0 that every rank connects to.
  std::optional<std::string> master;
  auto store_file = lookup(env, "RATION_STORE_FILE");
  if (store_file) {
    RATION_CHECK(!store_file->empty(), "distributed init: RATION_STORE_FILE is set but empty; expected a path "
                 "every rank can open (a fresh file per run)");
    try {
      state->store = c10::make_intrusive<c10d::FileStore>(*store_file, state->size);
    } catch (const std::exception& e) {
      RATION_CHECK(false, "distributed init: cannot open RATION_STORE_FILE='", *store_file, "': ", e.what());
    }
    master = lookup(env, "MASTER_ADDR");  // only to choose Gloo's interface (loopback for a loopback address)
  } else {
    master = require(env, "MASTER_ADDR", "the host name or IP address of rank 0 (e.g. 127.0.0.1)");
    const std::string port_text = require(env, "MASTER_PORT", "a TCP port, an integer in [1, 65535]");
    const auto port = parse_int("MASTER_PORT", port_text, 1, 65535, "a TCP port, an integer in [1, 65535]");
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = state->rank == 0;
    opts.numWorkers = static_cast<std::size_t>(state->size);
    opts.waitWorkers = true;
    opts.timeout = timeout;
    try {
      state->store = c10::make_intrusive<c10d::TCPStore>(*master, opts);
    } catch (const std::exception& e) {
      RATION_CHECK(false, "distributed init: rank ", state->rank, " could not rendezvous through the TCPStore at ",
                   *master, ":", port, (state->rank == 0 ? " (as its server)" : " (as a client)"), ": ", e.what(),
                   " (is MASTER_PORT free on rank 0's host, and are all WORLD_SIZE=", state->size,
                   " ranks started within the timeout (dist.timeout_s, or RATION_DIST_TIMEOUT_S)?)");
    }
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ration/world", state->store);
  state->timeout = timeout;

  try {
    if (state->backend == Backend::Gloo) {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      state->gloo_device = gloo_device(env, master);
      opts->devices.push_back(state->gloo_device);
      state->group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, state->rank, state->size, opts);
    }
#ifdef RATION_CUDA
    else {
      const int64_t devices = c10::cuda::device_count();
      RATION_CHECK(devices > 0, "distributed init: RATION_DIST_BACKEND=nccl but no CUDA device is visible");
      const int64_t local = lookup(env, "LOCAL_RANK")
                                ? parse_int("LOCAL_RANK", *lookup(env, "LOCAL_RANK"), 0, devices - 1,
                                            "an integer in [0, visible CUDA devices)")
                                : state->rank % devices;
      state->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local));
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(local));
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      state->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, state->rank, state->size, opts);
    }
#endif
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    RATION_CHECK(false, "distributed init: rank ", state->rank, " of ", state->size, " could not create the ",
                 backend_name, " process group: ", e.what());
  }
  World w;
  w.state_ = std::move(state);
  return w;
}

World World::init_single() {
  World w;
  w.state_ = std::make_shared<State>();
  return w;
}

const World::State& World::state() const {
  RATION_CHECK(state_ != nullptr, "use of an uninitialised dist::World (call World::init() or init_single())");
  return *state_;
}

int World::rank() const { return state().rank; }
int World::size() const { return state().size; }
Backend World::backend() const { return state().backend; }
at::Device World::device() const { return state().device; }
const c10::intrusive_ptr<Collectives>& World::process_group() const { return state().group; }
const c10::intrusive_ptr<c10d::Store>& World::store() const { return state().store; }

void World::all_reduce_sum(at::Tensor& t) const {
  const State& s = state();
  RATION_CHECK(t.defined(), "all_reduce_sum of an undefined tensor");
  if (!s.group || t.numel() == 0) return;
  std::vector<at::Tensor> buf{t.is_contiguous() ? t : t.contiguous()};
  run_collective("all_reduce_sum", s.rank, s.size, [&] { return s.group->allreduce(buf); });
  if (!buf[0].is_same(t)) t.copy_(buf[0]);
}

at::Tensor World::all_gather(const at::Tensor& t) const {
  const State& s = state();
  RATION_CHECK(t.defined(), "all_gather of an undefined tensor");
  const at::Tensor in = t.contiguous();
  at::Tensor flat = at::empty({s.size * in.numel()}, in.options());  // (size * numel)
  if (!s.group) {
    flat.copy_(in.reshape({-1}));
    return flat;
  }
  if (in.numel() == 0) return flat;
  std::vector<at::Tensor> inputs{in};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < s.size; ++r) outputs[0].push_back(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
  run_collective("all_gather", s.rank, s.size, [&] { return s.group->allgather(outputs, inputs); });
  return flat;
}

std::vector<at::Tensor> World::all_to_all(const std::vector<at::Tensor>& pieces) const {
  const State& s = state();
  RATION_CHECK(static_cast<int>(pieces.size()) == s.size, "all_to_all: one piece per rank expected (", s.size,
               "); got ", pieces.size());
  for (const at::Tensor& p : pieces)
    RATION_CHECK(p.defined() && p.dim() == 1 && p.scalar_type() == pieces[0].scalar_type(),
                 "all_to_all: pieces must be 1-D tensors of one dtype; got ", p.defined() ? p.sizes() : at::IntArrayRef{},
                 " ", p.defined() ? p.scalar_type() : at::kFloat, " beside ", pieces[0].scalar_type());
  if (!s.group) return {pieces[0].contiguous()};
  // The lengths first: lengths_out[r] = what this rank sends to r, lengths_in[r] = what r sends here.
  at::Tensor lengths_out = at::empty({s.size}, at::kLong), lengths_in = at::empty({s.size}, at::kLong);
  for (int r = 0; r < s.size; ++r) lengths_out.data_ptr<int64_t>()[r] = pieces[static_cast<size_t>(r)].numel();
  std::vector<int64_t> equal;  // empty: equal splits, one element per rank
  run_collective("all_to_all (lengths)", s.rank, s.size,
                 [&] { return s.group->alltoall_base(lengths_in, lengths_out, equal, equal); });
  // Then the pieces, each followed by one padding element (a split of 0 elements is never sent).
  std::vector<at::Tensor> padded;
  std::vector<int64_t> send_splits, recv_splits;
  int64_t received = 0;
  for (int r = 0; r < s.size; ++r) {
    const at::Tensor& p = pieces[static_cast<size_t>(r)];
    padded.push_back(p.contiguous());
    padded.push_back(at::zeros({1}, p.options()));
    send_splits.push_back(p.numel() + 1);
    recv_splits.push_back(lengths_in.data_ptr<int64_t>()[r] + 1);
    received += recv_splits.back();
  }
  at::Tensor out_flat = at::empty({received}, pieces[0].options()), in_flat = at::cat(padded);
  // c10d's Gloo takes the split vectors by reference and moves them into its work: hand it copies.
  std::vector<int64_t> recv_copy = recv_splits, send_copy = send_splits;
  run_collective("all_to_all", s.rank, s.size,
                 [&] { return s.group->alltoall_base(out_flat, in_flat, recv_copy, send_copy); });
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (int r = 0; r < s.size; ++r) {
    out.push_back(out_flat.narrow(0, at, recv_splits[static_cast<size_t>(r)] - 1));
    at += recv_splits[static_cast<size_t>(r)];
  }
  return out;
}

void World::send_recv(const PeerTensors& sends, const PeerTensors& recvs, int tag) const {
  const State& s = state();
  for (const auto* list : {&sends, &recvs}) {
    for (const auto& [peer, t] : *list) {
      RATION_CHECK(peer >= 0 && peer < s.size && peer != s.rank, "send_recv: peer ", peer,
                   " is not another rank of this world (rank ", s.rank, " of ", s.size, ")");
      RATION_CHECK(t.defined() && t.is_contiguous(), "send_recv: tensors must be defined and contiguous");
    }
  }
  if (!s.group) return;
  try {
    std::vector<std::vector<at::Tensor>> bufs;
    bufs.reserve(sends.size() + recvs.size());
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (const auto& [peer, t] : sends) {
      bufs.push_back({t});
      works.push_back(s.group->send(bufs.back(), peer, tag));
    }
    for (const auto& [peer, t] : recvs) {
      bufs.push_back({t});
      works.push_back(s.group->recv(bufs.back(), peer, tag));
    }
    for (auto& w : works) w->wait();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(detail::str("point-to-point send_recv (tag ", tag, ") failed on rank ", s.rank, " of ",
                                      s.size, ": ", e.what(), " (a peer that exited or timed out shows up here)"));
  }
}

void World::broadcast(at::Tensor& t, int root) const {
  const State& s = state();
  RATION_CHECK(t.defined(), "broadcast of an undefined tensor");
  RATION_CHECK(root >= 0 && root < s.size, "broadcast root ", root, " is not a rank of this world (size ", s.size,
               ")");
  if (!s.group || t.numel() == 0) return;
  std::vector<at::Tensor> buf{t.is_contiguous() ? t : t.contiguous()};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  run_collective("broadcast", s.rank, s.size, [&] { return s.group->broadcast(buf, opts); });
  if (!buf[0].is_same(t)) t.copy_(buf[0]);
}

void World::barrier() const {
  const State& s = state();
  if (!s.group) return;
  run_collective("barrier", s.rank, s.size, [&] { return s.group->barrier(); });
}

World World::open_group(const std::string& key, const std::string& name, int rank, int size) const {
  const State& s = state();
  World w;
  w.state_ = std::make_shared<State>();
  State& c = *w.state_;
  c.rank = rank;
  c.size = size;
  c.backend = s.backend;
  c.device = s.device;
  c.store = s.store;
  c.timeout = s.timeout;
  c.gloo_device = s.gloo_device;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key, s.store);
  try {
    if (s.backend == Backend::Gloo) {
      auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
      opts->devices.push_back(s.gloo_device);
      c.group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
    }
#ifdef RATION_CUDA
    else {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = s.timeout;
      c.group = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
    }
#endif
  } catch (const std::exception& e) {
    throw CollectiveError(detail::str("rank ", s.rank, " of ", s.size, " could not open the process group '", name,
                                      "': ", e.what()));
  }
  return w;
}

World World::open_channel(const std::string& name) const {
  const State& s = state();
  if (!s.group) {
    World w;
    w.state_ = std::make_shared<State>();  // one process
    return w;
  }
  // Every rank opens channels in the same order, so the count names the same keys everywhere; a second
  // channel of the same name (a second run in one process) must not meet the first one's addresses.
  const int serial = const_cast<State&>(s).channels_opened++;
  return open_group("ration/" + name + "/" + std::to_string(serial), name, s.rank, s.size);
}

World World::subgroup(const std::string& name, const std::vector<int>& members) const {
  const State& s = state();
  const auto at = std::find(members.begin(), members.end(), s.rank);
  RATION_CHECK(at != members.end(), "process group '", name, "': rank ", s.rank, " is not one of its members");
  for (int m : members)
    RATION_CHECK(m >= 0 && m < s.size && std::count(members.begin(), members.end(), m) == 1, "process group '", name,
                 "': members must be distinct ranks in [0, ", s.size, ")");
  if (!s.group || members.size() == 1) {
    World w;
    w.state_ = std::make_shared<State>();  // one process (no store keys, no sockets)
    return w;
  }
  // The members are part of the store key: two runs in one process may give one name to groups of other
  // members (a layout's "model-0-0" is ranks {0, 1} in one run, {0, 1, 2, 3} in the next), and only the
  // members of a group count its openings.
  std::string key = name + "/";
  for (int m : members) key += std::to_string(m) + ",";
  const int serial = const_cast<State&>(s).subgroups_opened[key]++;
  return open_group("ration/sub/" + key + "/" + std::to_string(serial), name, static_cast<int>(at - members.begin()),
                    static_cast<int>(members.size()));
}

std::shared_ptr<ReplicaGroup> World::replica_group() const {
  State& s = const_cast<State&>(state());
  std::lock_guard<std::mutex> lock(s.replica_mu);
  if (auto g = s.replica_group.lock()) return g;
  auto g = std::make_shared<C10dReplicaGroup>(*this);
  s.replica_group = g;
  return g;
}

// ---- C10dReplicaGroup -----------------------------------------------------------------------------
C10dReplicaGroup::C10dReplicaGroup(World world) : world_(std::move(world)) {
  RATION_CHECK(world_.defined(), "C10dReplicaGroup needs an initialised World");
}

at::Tensor C10dReplicaGroup::all_gather(const at::Tensor& shard) {
  RATION_CHECK(shard.defined() && shard.dim() == 1 && shard.scalar_type() == at::kByte,
               "ReplicaGroup::all_gather takes a 1-D uint8 shard; got ",
               shard.defined() ? shard.sizes() : at::IntArrayRef{}, " ",
               shard.defined() ? c10::toString(shard.scalar_type()) : "undefined");
  const at::Device home = shard.device();
  at::Tensor gathered = world_.all_gather(home == world_.device() ? shard : shard.to(world_.device()));
  return home == world_.device() ? gathered : gathered.to(home);  // (size * shard.numel())
}

}  // namespace ration::dist
