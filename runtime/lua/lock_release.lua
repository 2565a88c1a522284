-- Releases a distributed lock if the caller owns it (compare-and-delete) and wakes waiters.
-- KEYS as lock_acquire.lua (by order). ARGV[1] token  ARGV[2] wake-up channel  ARGV[3] lock name
-- ARGV[4] 'any' or 'fifo'  ARGV[5] 'any': a waiter's token to hand the lock to ('' none); 'fifo':
-- the first waiter for this lock in the caller's service ('' none)
-- ARGV[6] that waiter's ttl ms  'any' only: ARGV[7] the caller's service id  ARGV[8] hand-offs it
-- made in a row
-- FIFO: the caller's ticket is removed too (a waiter giving up calls this), and a free lock with
-- a live ticket at the queue's head is handed to that waiter in place: it is set to the waiter's
-- token and TTL (both read from the token) with a new fence. The reply names it; unless it is
-- ARGV[5] (a waiter of the caller's service, told by the reply; when it is the head, its ticket
-- is not read), the message 'g|<token>|<fence>|<name>' tells it so.
-- 'any' with ARGV[5]: the lock is set to that token (a waiter in the caller's process, told by the
-- reply) with a new fence. Otherwise the lock is deleted and 'r|<name>' wakes the waiters to race.
-- From the 8th hand-off in a row on, while another service is marked as waiting (KEYS[3], see
-- lock_acquire.lua), the lock is reserved for the one that waits longest instead ('~<its id>') and
-- 'r|<name>' wakes one waiter of each service; the answer is {1, -1}. The reservation lasts while
-- the marked waiter still waits, at most 100 ms (its service's attempt comes well within that,
-- even on a loaded machine), and uses the mark up: a waiter that left or died costs at most one
-- such pause. Attempts of other services meanwhile fail (the caller's own waiters too) and mark
-- theirs, so the turn comes back after the other's streak.
-- Returns {1} when the caller owned the lock, {1, fence} when it was handed to ARGV[5],
-- {1, fence, token} when FIFO handed it to token, else {0} ({0, fence, token} when the caller's
-- leaving freed the head's turn and FIFO handed the free lock to token) (nothing of another owner
-- is touched).
local fifo = ARGV[4] == 'fifo'

-- Wake-ups go by sharded pub/sub (ARGV[2] is a channel of the lock's slot: only its shard hears
-- them); before Redis 7.0, which has no SPUBLISH, by PUBLISH.
local function wake(message)
  if type(redis.pcall('SPUBLISH', ARGV[2], message)) == 'table' then redis.call('PUBLISH', ARGV[2], message) end
end

local function new_fence() -- (never below the server's time in µs: see lock_acquire.lua)
  local f = redis.call('INCR', KEYS[2])
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if f < floor then
    f = floor
    redis.call('SET', KEYS[2], string.format('%.0f', f))
  end
  return f
end

-- Hands the (free) lock to the head of the FIFO queue: {token, fence}, or nil when nobody live
-- is queued. The head's token carries its ticket (see lock_acquire.lua): "<random>:<wait>:<ttl>".
local function hand_off()
  local now_ms = nil
  while true do
    local h = redis.call('ZPOPMIN', KEYS[3])
    if not h[1] then return nil end
    local wait, ttl = string.match(h[1], ':(%d+):(%d+)$')
    if wait and not now_ms then
      local t = redis.call('TIME')
      now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    if wait and math.floor(tonumber(h[2]) / 1000) + tonumber(wait) > now_ms then
      redis.call('SET', KEYS[1], h[1], 'PX', ttl)
      local f = new_fence()
      if h[1] ~= ARGV[5] then
        wake('g|' .. h[1] .. '|' .. string.format('%.0f', f) .. '|' .. ARGV[3])
      end
      return {h[1], f}
    end
  end
end

local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  if fifo then redis.call('ZREM', KEYS[3], ARGV[1]) end
  -- A FIFO waiter that leaves may have been the head that a free lock waited for.
  if fifo and not current then
    local to = hand_off()
    if to then return {0, to[2], to[1]} end
  end
  return {0}
end
-- (An owner has no ticket: taking the lock took it out of the queue.)
if fifo then
  -- Most often the head is the caller's hint, a waiter alive in its service whose TTL it sent:
  -- handed on without reading the head's ticket.
  if ARGV[5] ~= '' and redis.call('ZRANK', KEYS[3], ARGV[5]) == 0 then
    redis.call('ZREM', KEYS[3], ARGV[5])
    redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
    return {1, new_fence(), ARGV[5]}
  end
  local to = hand_off()
  -- The new owner and its fence: when it waits in the caller's service, this reply tells it (the
  -- message too, unless it is ARGV[5]).
  if to then return {1, to[2], to[1]} end
elseif ARGV[5] ~= '' then
  if tonumber(ARGV[8]) >= 8 then
    -- The other service that has waited longest and still waits (the caller's own waiters are
    -- served here); marks whose waits are over (or unreadable) go.
    local marks = redis.call('HGETALL', KEYS[3])
    local now, pick, pick_since, pick_left = nil, nil, nil, nil
    for i = 1, #marks, 2 do
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local since, till = string.match(marks[i + 1], '^(%d+):(%d+)$')
      local left = till and tonumber(till) - now or 0
      if left <= 0 then
        redis.call('HDEL', KEYS[3], marks[i])
      elseif marks[i] ~= ARGV[7] and (not pick or tonumber(since) < pick_since) then
        pick, pick_since, pick_left = marks[i], tonumber(since), left
      end
    end
    if pick then
      redis.call('HDEL', KEYS[3], pick)
      redis.call('SET', KEYS[1], '~' .. pick, 'PX', string.format('%d', math.min(pick_left, 100)))
      wake('r|' .. ARGV[3])
      return {1, -1}
    end
  end
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
  return {1, new_fence()}
end
redis.call('DEL', KEYS[1])
-- No waiter of the caller's service is left to hand it to: a mark of its own would only reserve
-- the lock for nobody later.
if not fifo then redis.call('HDEL', KEYS[3], ARGV[7]) end
wake('r|' .. ARGV[3])
return {1}
