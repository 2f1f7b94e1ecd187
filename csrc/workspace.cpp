#include "workspace.h"

#include <algorithm>
#include <mutex>

#include <ATen/ops/empty.h>

namespace mpgemm {
namespace {

std::mutex stats_mutex;
WorkspaceStats stats;

}  // namespace

at::Tensor allocate_workspace(size_t bytes, const at::Tensor& anchor) {
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, anchor.options().dtype(at::kByte));
  const std::lock_guard<std::mutex> lock(stats_mutex);
  stats.calls += 1;
  stats.bytes += static_cast<int64_t>(bytes);
  stats.largest_bytes = std::max(stats.largest_bytes, static_cast<int64_t>(bytes));
  return workspace;
}

WorkspaceStats workspace_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
}

void reset_workspace_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  stats = WorkspaceStats{};
}

}  // namespace mpgemm
