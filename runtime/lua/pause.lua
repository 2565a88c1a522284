-- Pauses a group: nothing more of it starts until resume. Its lane is parked at once when it is
-- in ready (or a level's list) within 200,000 lanes of either end (LPOS, about 10 ms a list at
-- most, and level lists are seldom long: a longer search would hold the server up); a lane
-- deeper is parked by the claim that meets it. When its job
-- is running, the lane is parked as that job finishes; when it waits in delayed for a retry's
-- backoff, as it comes due (so a resume before then keeps the backoff).
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>paused  KEYS[3] <prefix>parked  KEYS[4] <prefix>delayed (unused)
-- ARGV[1] group  ARGV[2] why (JSON: {"state":"paused",...})
-- Returns: 1 when paused now, 0 when it already was (a halted group stays halted).
local ready, paused, parked = KEYS[1], KEYS[2], KEYS[3]
local prefix = string.sub(ready, 1, -6)
--@levels
local group = ARGV[1]
local lane, bound = 'g:' .. group, 200000
if redis.call('HSETNX', paused, group, ARGV[2]) == 0 then return 0 end
-- (a group's lane waits in ready or in its head's level's list: see levels)
for _, list in ipairs({ready, level_keys[1], level_keys[2], level_keys[3], level_keys[4]}) do
  local from = 1
  local at = redis.call('LPOS', list, lane, 'MAXLEN', bound)
  if not at and redis.call('LLEN', list) > bound then
    from = -1
    at = redis.call('LPOS', list, lane, 'RANK', -1, 'MAXLEN', bound)
  end
  if at then
    redis.call('LREM', list, from, lane) -- from the end it was found near: bounded too
    redis.call('SADD', parked, group)
    wake_levels() -- (ready may be empty now)
    break
  end
end
return 1
