// `taxfree bench all_gather`: NCCL on plain buffers and on the symmetric window (the BSP baselines,
// NCCL at its best is the faster of the two) against the in-kernel push; `push-direct` forces the
// direct protocol at every size, to show where the low-latency one pays.
#include "../../bench/bench_util.cuh"
#include "taxfree/bench/harness.h"
#include "taxfree/ops/all_gather.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {

namespace {

class AllGatherBench final : public OpBench {
 public:
  std::string name() const override { return "all_gather"; }
  std::vector<std::string> variants() const override { return {"nccl", "nccl-sym", "push", "push-direct"}; }
  int baseline_count() const override { return 2; }
  int min_ranks() const override { return 2; }
  void check_options(const Options& o) const override {
    check_shape_entries(o.shapes, {{"bytes_per_rank", {}, kMaxBytes}});
  }

  std::vector<Case> cases(const Options& o, const Team& team) const override {
    std::vector<Case> out;
    for (int64_t b : size_sweep(o, 1 << 10, 1 << 30, 16)) {
      Case c;
      c.size_bytes = b * team.world();
      c.count = b / 2;
      c.type = "bf16";
      c.params = {{"bytes_per_rank", b}};
      c.label = "per rank " + std::to_string(b) + " B";
      if (matches_shape_filters(c.params, o.shapes)) out.push_back(c);
    }
    return out;
  }

  void setup(Team& team, const Case& c, const Options& o) override {
    team_ = &team;
    bytes_ = uint64_t(c.size_bytes / team.world());
    if (!op_) {
      op_ = std::make_unique<AllGather>(team);
      AllGatherConfig direct;
      direct.ll_max_bytes = 0;
      direct_ = std::make_unique<AllGather>(team, direct);
    }
    op_->set_skip_signal(o.skip_signal_rank == team.rank());
    direct_->set_skip_signal(o.skip_signal_rank == team.rank());
    mark_ = team.heap().mark();
    send_heap_ = team.heap().allocate(bytes_, 4096, "bench.all_gather.send");
    recv_heap_ = team.heap().allocate(bytes_ * team.world(), 4096, "bench.all_gather.recv");
    TF_CUDA(cudaMalloc(&send_plain_, bytes_));
    TF_CUDA(cudaMalloc(&recv_plain_, bytes_ * team.world()));
    seed_ = o.seed ^ (bytes_ * 0x9E3779B97F4A7C15ull);
    fill_random16(send_heap_, bytes_, seed_, uint64_t(team.rank()), team.stream());
    TF_CUDA(cudaMemcpyAsync(send_plain_, send_heap_, bytes_, cudaMemcpyDeviceToDevice, team.stream()));
    team.sync(team.stream());
  }

  void poison(cudaStream_t s) override {
    poison16(recv_heap_, bytes_ * team_->world(), s);
    poison16(recv_plain_, bytes_ * team_->world(), s);
  }

  void run(const std::string& v, cudaStream_t s) override {
    if (v == "nccl") op_->launch(AllGatherVariant::nccl, send_plain_, recv_plain_, bytes_, s);
    else if (v == "nccl-sym") op_->launch(AllGatherVariant::nccl, send_heap_, recv_heap_, bytes_, s);
    else (v == "push" ? op_ : direct_)->launch(AllGatherVariant::push, send_heap_, recv_heap_, bytes_, s);
  }

  int64_t check(const std::string& v, cudaStream_t s) override {
    const char* recv = static_cast<const char*>(v == "nccl" ? recv_plain_ : recv_heap_);
    int64_t wrong = 0;
    for (int r = 0; r < team_->world(); ++r)
      wrong += count_mismatch16(recv + uint64_t(r) * bytes_, bytes_, seed_, uint64_t(r), s);
    return wrong;
  }

  Figures figures(const Case& c, double seconds) const override {
    Figures f;
    f.algbw_gbs = double(c.size_bytes) / seconds * 1e-9;
    f.busbw_gbs = f.algbw_gbs * bus_factor("all_gather", team_->world());
    return f;
  }

  Floor floor(const Case& c, const MachineRates& r) const override {
    // Each rank receives (world-1) shards through its links (NVLink rate measured by the copy
    // engine), and at least one flag latency passes before anything can arrive.
    const double recv_bytes = double(c.size_bytes) * (team_->world() - 1) / team_->world();
    const double bytes_s = r.nvlink_bytes_per_s > 0 ? recv_bytes / r.nvlink_bytes_per_s : 0;
    return {std::max(bytes_s, r.flag_latency_s), bytes_s > r.flag_latency_s ? "nvlink" : "latency"};
  }

  void teardown() override {
    cudaFree(send_plain_);
    cudaFree(recv_plain_);
    team_->heap().release(mark_);
  }

 private:
  Team* team_ = nullptr;
  std::unique_ptr<AllGather> op_, direct_;
  uint64_t bytes_ = 0, seed_ = 0, mark_ = 0;
  void *send_heap_ = nullptr, *recv_heap_ = nullptr, *send_plain_ = nullptr, *recv_plain_ = nullptr;
};

}  // namespace

std::unique_ptr<OpBench> make_all_gather_bench() { return std::make_unique<AllGatherBench>(); }

}  // namespace taxfree::bench
