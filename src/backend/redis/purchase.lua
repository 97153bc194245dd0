-- purchase, as a compare-and-set on the room's stock and mode: ARGV[3],
-- ARGV[4] = the stock and mode the caller computed from, ARGV[5], ARGV[6]
-- = the stock left and the mode after the purchase (rules::take_stock
-- decides both, in Rust). Written only if stock and mode are still those;
-- else the answer is 'moved' with them as they are, and the caller
-- computes again. So however many instances report at once, the stock
-- never goes below zero and exactly one report turns the room sold out.
-- Returns {r = 'ok', view = {...}} | {r = 'moved', stock, mode}
--       | {r = 'nostock'} | {r = 'noroom'}
if not room({'stock', 'mode'}) then return reply({r = 'noroom'}) end
if not M['stock'] or M['stock'] == '' then return reply({r = 'nostock'}) end
if M['stock'] ~= ARGV[3] or mode() ~= ARGV[4] then
  return reply({r = 'moved', stock = tonumber(M['stock']), mode = mode()})
end
set('stock', ARGV[5])
set('mode', ARGV[6])
changed()
return reply({r = 'ok', view = view_fields()})
