// The Lua scripts of runtime/lua/, embedded at build time (see runtime/embed_text.cmake).
#pragma once

namespace jobrt::lua {
extern const char* const enqueue;
extern const char* const claim;
extern const char* const finish;
extern const char* const extend;
extern const char* const release;
extern const char* const reap;
extern const char* const promote;
extern const char* const pause;
extern const char* const resume;
extern const char* const cancel;
extern const char* const requeue;
extern const char* const purge;
extern const char* const check_fix;
extern const char* const expire_own;
extern const char* const advertise;
extern const char* const reap_turn;
extern const char* const reports;
extern const char* const history;
extern const char* const schedule_put;
extern const char* const schedule_fire;  // with the line "--@enqueue.lua" for enqueue's text
}  // namespace jobrt::lua
