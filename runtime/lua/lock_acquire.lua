-- Takes a distributed lock (jobrt::lock_service, runtime/src/lock/redis_lock.cpp).
-- KEYS[1] the lock (string: owner token, PX TTL)   KEYS[2] its fence counter (never expires)
-- FIFO order: KEYS[3] the queue (zset: token -> arrival, us)  KEYS[4] tickets (hash: token ->
-- "deadline_ms|ttl_ms|service id": a release hands the lock to the head in place, and publishes
-- only when the head waits in another service)
-- 'any' order: KEYS[3] the service id of the last waiter that failed (string, PX)
-- (Only the keys of the caller's order are passed: fewer arguments to send, all the keys it touches declared.)
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] 'any' or 'fifo'  ARGV[4] '1': the caller waits (FIFO:
-- queue a ticket; any: mark KEYS[3])  ARGV[5] ms the ticket stays valid (the remaining wait)
-- ARGV[6] the caller's service id
-- Returns {1, fence} when the caller holds the lock (also when it already did: a resent call, or a
-- FIFO hand-off whose message was lost), else {0, ms to wait for: the holder's PTTL, or the
-- ticket of the queue's head; -1 when unknown}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- A fence larger than any before, also after the server lost its data: a new counter starts at
-- the server's time in microseconds, beyond every count an earlier life of the counter reached.
local function next_fence()
  local f = redis.call('INCR', KEYS[2])
  if f == 1 then
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', f))
  end
  return f
end

local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end

local fifo = ARGV[3] == 'fifo'
local head = nil
local head_deadline = nil
if fifo then
  -- Tickets whose waiter gave up without leaving (a dead process) are dropped at the head.
  while true do
    local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not h then break end
    local info = redis.call('HGET', KEYS[4], h)
    local deadline = info and tonumber(string.match(info, '^(%d+)'))
    if deadline and deadline > now_ms then
      head = h
      head_deadline = deadline
      break
    end
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
  end
end

if not current and (head == nil or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if not fifo and redis.call('GET', KEYS[3]) == ARGV[6] then redis.call('DEL', KEYS[3]) end
  if head then
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
  end
  return {1, next_fence()}
end

if fifo and ARGV[4] == '1' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    redis.call('ZADD', KEYS[3], string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2])), ARGV[1])
  end
  redis.call('HSET', KEYS[4], ARGV[1], string.format('%d|', now_ms + tonumber(ARGV[5])) .. ARGV[2] .. '|' .. ARGV[6])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]) + 60000)
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[5]) + 60000)
end

local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 and head_deadline then pttl = head_deadline - now_ms end
if not fifo and ARGV[4] == '1' then
  -- Tells a holder's service that handed the lock on within itself for long that others wait.
  redis.call('SET', KEYS[3], ARGV[6], 'PX', math.max(pttl, 0) + 1000)
end
return {0, pttl}
