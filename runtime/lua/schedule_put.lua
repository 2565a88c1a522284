-- Stores, replaces or removes a repeatable job (backend.hpp's put_schedule, remove_schedule).
-- KEYS[1] <prefix>schedules: name -> '<length of group>:<group><spec>'
-- KEYS[2] <prefix>schedule_due: the names, each scored by its next firing (ms since the epoch)
-- ARGV[1] name, ARGV[2] its value ('' removes it), ARGV[3] its next firing
-- Returns 1 when the queue had a schedule of that name, else 0. A change wakes the schedulers:
-- SPUBLISH <prefix>schedules (before Redis 7.0, PUBLISH).
local schedules, due, name = KEYS[1], KEYS[2], ARGV[1]
local had = redis.call('HDEL', schedules, name)
redis.call('ZREM', due, name)
if ARGV[2] ~= '' then
  redis.call('HSET', schedules, name, ARGV[2])
  redis.call('ZADD', due, ARGV[3], name)
end
if had == 1 or ARGV[2] ~= '' then
  if type(redis.pcall('SPUBLISH', schedules, name)) == 'table' then redis.call('PUBLISH', schedules, name) end
end
return had
