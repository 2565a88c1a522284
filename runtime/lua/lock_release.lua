-- Releases a distributed lock if the caller owns it (compare-and-delete) and wakes waiters.
-- KEYS as lock_acquire.lua. ARGV[1] token  ARGV[2] wake-up channel  ARGV[3] lock name
-- ARGV[4] 'any' or 'fifo'
-- FIFO: the caller's ticket is removed too (a waiter giving up calls this), and a lock with a
-- live ticket at the queue's head is handed to that waiter in place: it is set to the waiter's
-- token and TTL with a new fence, and the message 'g|<token>|<fence>|<name>' tells it so.
-- Otherwise the lock is deleted and 'r|<name>' wakes the waiters to race for it.
-- Returns 1 when the caller owned the lock, else 0 (nothing of another owner is touched).
local fifo = ARGV[4] == 'fifo'
if fifo then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end

if fifo then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not h then break end
    local info = redis.call('HGET', KEYS[4], h)
    redis.call('ZREM', KEYS[3], h)
    redis.call('HDEL', KEYS[4], h)
    local deadline, ttl = nil, nil
    if info then deadline, ttl = string.match(info, '^(%d+)|(%d+)$') end
    if deadline and tonumber(deadline) > now_ms then
      redis.call('SET', KEYS[1], h, 'PX', ttl)
      local f = redis.call('INCR', KEYS[2])
      if f == 1 then  -- the counter was lost with the server's data: see lock_acquire.lua
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', KEYS[2], string.format('%.0f', f))
      end
      redis.call('PUBLISH', ARGV[2], 'g|' .. h .. '|' .. string.format('%.0f', f) .. '|' .. ARGV[3])
      return 1
    end
  end
end

redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'r|' .. ARGV[3])
return 1
