// The kernels' switches (plan/switches.h).
#include "plan/switches.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mpgemm::kernels {

std::optional<bool> switch_setting(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw std::invalid_argument(std::string(name) + " must be '0' or '1', got '" + value + "'");
}

bool switch_on(const char* name, bool by_default) { return switch_setting(name).value_or(by_default); }

}  // namespace mpgemm::kernels
