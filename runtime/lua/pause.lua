-- Pauses a group: nothing more of it starts until resume. Its lane is parked at once when it is
-- in ready (LREM: O(length of ready), an operator's call); when its job is running, the lane is
-- parked as that job finishes; when it waits in delayed for a retry's backoff, as it comes due
-- (so a resume before then keeps the backoff).
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>paused  KEYS[3] <prefix>parked  KEYS[4] <prefix>delayed (unused)
-- ARGV[1] group  ARGV[2] why (JSON: {"state":"paused",...})
-- Returns: 1 when paused now, 0 when it already was (a halted group stays halted).
local ready, paused, parked = KEYS[1], KEYS[2], KEYS[3]
local group = ARGV[1]
if redis.call('HSETNX', paused, group, ARGV[2]) == 0 then return 0 end
if redis.call('LREM', ready, 1, 'g:' .. group) == 1 then redis.call('SADD', parked, group) end
return 1
