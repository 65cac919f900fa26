// RUN: cse
// Operands of commutative ops (add, mul, maximum, equal, ...) are an unordered pair; those
// of sub, div, less, ... are not.
graph @f(
    %x: f32[3],
    %y: f32[3]
) -> (f32[3], f32[3], f32[3], f32[3], bool[3], bool[3], bool[3], bool[3]) {
  %0 = add(%x, %y) : f32[3]
  %1 = add(%y, %x) : f32[3]
  %2 = sub(%x, %y) : f32[3]
  %3 = sub(%y, %x) : f32[3]
  %4 = equal(%x, %y) : bool[3]
  %5 = equal(%y, %x) : bool[3]
  %6 = less(%x, %y) : bool[3]
  %7 = less(%y, %x) : bool[3]
  return %0, %1, %2, %3, %4, %5, %6, %7
}
// EXPECT:
graph @f(
    %x: f32[3],
    %y: f32[3]
) -> (f32[3], f32[3], f32[3], f32[3], bool[3], bool[3], bool[3], bool[3]) {
  %0 = add(%x, %y) : f32[3]
  %1 = sub(%x, %y) : f32[3]
  %2 = sub(%y, %x) : f32[3]
  %3 = equal(%x, %y) : bool[3]
  %4 = less(%x, %y) : bool[3]
  %5 = less(%y, %x) : bool[3]
  return %0, %0, %1, %2, %3, %3, %4, %5
}
