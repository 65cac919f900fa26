// RUN: canonicalize
// !(a == b) is a != b and the reverse (NaN included); max(x, x) = x; where with one
// branch twice, or a constant condition, picks a branch; add of a negation is a sub.
graph @f(
    %x: f32[3],
    %y: f32[3],
    %c: bool[3]
) -> (bool[3], bool[3], f32[3], f32[3], f32[3], f32[2,3], f32[3], f32[3]) {
  %0 = equal(%x, %y) : bool[3]
  %1 = logical_not(%0) : bool[3]
  %2 = not_equal(%x, %y) : bool[3]
  %3 = logical_not(%2) : bool[3]
  %4 = maximum(%x, %x) : f32[3]
  %5 = minimum(%y, %y) : f32[3]
  %6 = where(%c, %x, %x) : f32[3]
  %t = full() {shape=[2, 3], value=true, dtype=bool} : bool[2,3]
  %7 = where(%t, %x, %y) : f32[2,3]
  %8 = neg(%y) : f32[3]
  %9 = add(%8, %x) : f32[3]
  %10 = sub(%x, %8) : f32[3]
  return %1, %3, %4, %5, %6, %7, %9, %10
}
// EXPECT:
graph @f(
    %x: f32[3],
    %y: f32[3],
    %c: bool[3]
) -> (bool[3], bool[3], f32[3], f32[3], f32[3], f32[2,3], f32[3], f32[3]) {
  %0 = not_equal(%x, %y) : bool[3]
  %1 = equal(%x, %y) : bool[3]
  %2 = broadcast_to(%x) {shape=[2, 3]} : f32[2,3]
  %3 = sub(%x, %y) : f32[3]
  %4 = add(%x, %y) : f32[3]
  return %0, %1, %x, %y, %x, %2, %3, %4
}
