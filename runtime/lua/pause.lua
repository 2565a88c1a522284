-- Pauses a group: nothing more of it starts until resume. Its lane is parked at once when it is
-- in ready or in delayed (LREM: O(length of ready), an operator's call); when its job is running,
-- the lane is parked as that job finishes.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>paused  KEYS[3] <prefix>parked  KEYS[4] <prefix>delayed
-- ARGV[1] group  ARGV[2] why (JSON: {"state":"paused",...})
-- Returns: 1 when paused now, 0 when it already was (a halted group stays halted).
local ready, paused, parked, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group = ARGV[1]
if redis.call('HSETNX', paused, group, ARGV[2]) == 0 then return 0 end
local lane = 'g:' .. group
if redis.call('LREM', ready, 1, lane) == 1 or redis.call('ZREM', delayed, lane) == 1 then
  redis.call('SADD', parked, group)
end
return 1
