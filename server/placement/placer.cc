#include "server/placement/placer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/refusal_payload.h"
#include "server/placement/policy_order.h"
#include "server/placement/refusal.h"

namespace gpumem {
namespace placement {
namespace {

using ::gpumem::v1::DeviceRefusal;
using ::gpumem::v1::PlacementRefusal;

PlacementResult Fail(absl::Status status) {
  PlacementResult result;
  result.status = std::move(status);
  return result;
}

}  // namespace

Placer::Placer(DeviceCarver* carver, PlacerOptions options)
    : carver_(carver), options_(options) {}

absl::StatusOr<PreparedRequest> PrepareRequest(
    const gpumem::v1::AllocateRequest& request,
    const std::vector<DeviceView>& devices, const PlacerOptions& options) {
  absl::StatusOr<ResolvedPlacement> resolved =
      ResolvePlacement(request.placement(), devices);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<ShardPlan> plan = PlanShards(
      request, options.default_alignment, resolved->allowed_device_count());
  if (!plan.ok()) return plan.status();
  return PreparedRequest{*std::move(resolved), *std::move(plan)};
}

PlacementResult Placer::Allocate(const gpumem::v1::AllocateRequest& request,
                                 const DeviceSnapshot& snapshot) const {
  absl::StatusOr<PreparedRequest> prepared =
      PrepareRequest(request, snapshot.devices, options_);
  if (!prepared.ok()) return Fail(prepared.status());
  return Place(*prepared, snapshot);
}

PlacementResult Placer::Place(const PreparedRequest& request,
                              const DeviceSnapshot& snapshot) const {
  const ResolvedPlacement& resolved = request.placement;
  const ShardPlan& plan = request.plan;
  const std::vector<uint32_t> candidates = CandidateOrder(resolved, snapshot);
  const size_t shard_count = plan.sizes.size();

  // Largest shard first; equal sizes keep shard order.
  std::vector<size_t> shard_order(shard_count);
  std::iota(shard_order.begin(), shard_order.end(), 0);
  std::stable_sort(
      shard_order.begin(), shard_order.end(),
      [&](size_t a, size_t b) { return plan.sizes[a] > plan.sizes[b]; });

  std::vector<std::optional<CarvedBlock>> blocks(shard_count);
  // holder[d]: the shard device d holds, if any.
  std::vector<std::optional<size_t>> holder(snapshot.devices.size());
  auto release_all = [&] {
    for (std::optional<CarvedBlock>& block : blocks) {
      if (block.has_value()) carver_->Release(*block);
      block.reset();
    }
  };

  for (size_t shard : shard_order) {
    const uint64_t size = plan.sizes[shard];
    // Refusals for this shard, by device.
    std::vector<Refusal> refusals;
    for (uint32_t device : candidates) {
      if (holder[device].has_value()) continue;
      Refusal refusal;
      absl::StatusOr<CarvedBlock> block =
          carver_->TryCarve(device, size, plan.alignment, &refusal);
      if (block.ok()) {
        blocks[shard] = *std::move(block);
        holder[device] = shard;
        break;
      }
      if (!refusal.refused || !absl::IsResourceExhausted(block.status())) {
        release_all();
        return Fail(block.status());
      }
      refusal.device = device;
      refusals.push_back(std::move(refusal));
    }
    if (blocks[shard].has_value()) continue;

    // Nothing holds this shard: undo the others and say why, per device.
    PlacementRefusal detail;
    detail.set_size_bytes(size);
    if (plan.sharded) {
      detail.set_shard_index(static_cast<uint32_t>(shard));
      detail.set_shard_count(static_cast<uint32_t>(shard_count));
      detail.set_total_bytes(plan.total_bytes);
    }
    std::vector<DeviceRefusal> devices;
    auto add = [&](uint32_t index, DeviceRefusal::Reason reason) {
      DeviceRefusal d;
      d.set_device_index(index);
      d.set_device_uuid(snapshot.devices[index].uuid);
      d.set_reason(reason);
      d.set_free_bytes(snapshot.devices[index].free_bytes);
      d.set_largest_free_bytes(snapshot.devices[index].largest_free_bytes);
      devices.push_back(std::move(d));
      return &devices.back();
    };
    for (const Refusal& refusal : refusals) {
      DeviceRefusal d = DeviceRefusalOf(refusal);
      d.set_device_uuid(snapshot.devices[refusal.device].uuid);
      devices.push_back(std::move(d));
    }
    for (uint32_t index = 0; index < holder.size(); ++index) {
      if (!holder[index].has_value()) continue;
      add(index, DeviceRefusal::REASON_HOLDS_SHARD)
          ->set_shard_index(static_cast<uint32_t>(*holder[index]));
    }
    for (uint32_t index : resolved.excluded) {
      add(index, DeviceRefusal::REASON_EXCLUDED);
    }
    std::sort(devices.begin(), devices.end(),
              [](const DeviceRefusal& a, const DeviceRefusal& b) {
                return a.device_index() < b.device_index();
              });
    for (DeviceRefusal& d : devices) *detail.add_devices() = std::move(d);

    release_all();
    PlacementResult result;
    result.status = RefusalStatus(detail);
    result.refusal = std::move(detail);
    return result;
  }

  PlacementResult result;
  result.blocks.reserve(shard_count);
  for (std::optional<CarvedBlock>& block : blocks) {
    result.blocks.push_back(*std::move(block));
  }
  return result;
}

}  // namespace placement
}  // namespace gpumem
