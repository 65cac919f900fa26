// RUN: canonicalize
// A reduction in which each output element is one input element (no axes, or only
// size-1 axes kept with keepdim) is the input itself, cast when the reduction widens the
// dtype (sum of i32 gives i64). Dropping a size-1 axis without keepdim changes the shape:
// it stays.
graph @f(%x: f32[2,1,3], %i: i32[2,1]) -> (f32[2,1,3], f32[2,1,3], i64[2,1], f32[2,3], f32[2,1,3]) {
  %0 = sum(%x) {axes=[1], keepdim=true} : f32[2,1,3]
  %1 = max(%x) {axes=[]} : f32[2,1,3]
  %2 = sum(%i) {axes=[1], keepdim=true} : i64[2,1]
  %3 = sum(%x) {axes=[1]} : f32[2,3]
  %4 = mean(%x) {axes=[1], keepdim=true} : f32[2,1,3]
  return %0, %1, %2, %3, %4
}
// EXPECT:
graph @f(%x: f32[2,1,3], %i: i32[2,1]) -> (f32[2,1,3], f32[2,1,3], i64[2,1], f32[2,3], f32[2,1,3]) {
  %0 = cast(%i) {dtype=i64} : i64[2,1]
  %1 = sum(%x) {axes=[1]} : f32[2,3]
  return %x, %x, %0, %1, %x
}
