// RUN: canonicalize
// neg(neg x) = x and not(not b) = b (involutions), relu(relu x) = relu x and
// abs(abs x) = abs x (idempotent), from the facts on the op records; chains collapse in
// one run. not(not i) of an integer is a bool, not i: it stays.
graph @f(
    %x: f32[4],
    %b: bool[4],
    %i: i32[4]
) -> (f32[4], f32[4], f32[4], bool[4], f32[4], bool[4]) {
  %0 = neg(%x) : f32[4]
  %1 = neg(%0) : f32[4]
  %2 = neg(%1) : f32[4]
  %3 = neg(%2) : f32[4]
  %4 = relu(%x) : f32[4]
  %5 = relu(%4) : f32[4]
  %6 = relu(%5) : f32[4]
  %7 = abs(%x) : f32[4]
  %8 = abs(%7) : f32[4]
  %9 = logical_not(%b) : bool[4]
  %10 = logical_not(%9) : bool[4]
  %11 = exp(%x) : f32[4]
  %12 = exp(%11) : f32[4]
  %13 = logical_not(%i) : bool[4]
  %14 = logical_not(%13) : bool[4]
  return %3, %6, %8, %10, %12, %14
}
// EXPECT:
graph @f(
    %x: f32[4],
    %b: bool[4],
    %i: i32[4]
) -> (f32[4], f32[4], f32[4], bool[4], f32[4], bool[4]) {
  %0 = relu(%x) : f32[4]
  %1 = abs(%x) : f32[4]
  %2 = exp(%x) : f32[4]
  %3 = exp(%2) : f32[4]
  %4 = logical_not(%i) : bool[4]
  %5 = logical_not(%4) : bool[4]
  return %x, %0, %1, %b, %3, %5
}
