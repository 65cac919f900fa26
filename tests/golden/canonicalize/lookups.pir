// RUN: canonicalize
// Whole rows of a 2-d numeric table picked by index_select (an ONNX Gather on axis 0) are
// an embedding lookup; other axes, other ranks and non-float tables keep their index_select.
// (abs keeps the random indices of the golden check inside the tables.)
graph @f(
    %t: f32[6,5],
    %i: i64[3],
    %j: i32[2],
    %b: bool[6,5],
    %c: f32[6,4,2]
) -> (f32[3,5], f32[2,5], f32[6,3], bool[3,5], f32[3,4,2]) {
  %k = abs(%i) : i64[3]
  %l = abs(%j) : i32[2]
  %0 = index_select(%t, %k) {axis=0} : f32[3,5]
  %1 = index_select(%t, %l) {axis=-2} : f32[2,5]
  %2 = index_select(%t, %k) {axis=1} : f32[6,3]
  %3 = index_select(%b, %k) {axis=0} : bool[3,5]
  %4 = index_select(%c, %k) {axis=0} : f32[3,4,2]
  return %0, %1, %2, %3, %4
}
// EXPECT:
graph @f(
    %t: f32[6,5],
    %i: i64[3],
    %j: i32[2],
    %b: bool[6,5],
    %c: f32[6,4,2]
) -> (f32[3,5], f32[2,5], f32[6,3], bool[3,5], f32[3,4,2]) {
  %k = abs(%i) : i64[3]
  %l = abs(%j) : i32[2]
  %0 = embedding(%t, %k) : f32[3,5]
  %1 = embedding(%t, %l) : f32[2,5]
  %2 = index_select(%t, %k) {axis=1} : f32[6,3]
  %3 = index_select(%b, %k) {axis=0} : bool[3,5]
  %4 = index_select(%c, %k) {axis=0} : f32[3,4,2]
  return %0, %1, %2, %3, %4
}
