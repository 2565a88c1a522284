// The distributed lock's Lua scripts (runtime/lua/lock_*.lua), embedded at build time.
#pragma once

namespace jobrt::lua {
extern const char* const lock_acquire;
extern const char* const lock_release;
extern const char* const lock_extend;
}  // namespace jobrt::lua
